"""Makes a Hugging Face-format model vLLM can serve from a GGUF file, offline.

Run by scripts/build-vllm-cpu.sh with the vLLM venv's Python (its transformers and gguf):
    python vllm-model-from-gguf.py MODEL.gguf OUT_DIR

transformers dequantizes the GGUF (Q4_K_M) and saves bf16 safetensors; the tokenizer comes from
the GGUF too. The GGUF carries no chat template, so Gemma's turn format is added, with both
end tokens (<eos> and <end_of_turn>) as generation stops: without <end_of_turn> every answer
runs to max_tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Gemma 3's turn format; a system message is folded into the first user turn, as Gemma has no
# system role.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = message['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "<start_of_turn>{{ role }}\n"
    "{%- if role == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif -%}"
    "{{ message['content'] | trim }}<end_of_turn>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model\n{%- endif -%}"
)


def main(gguf: str, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    path = Path(gguf)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    # Dequantized, the weights are plain tensors; the GGUF quantizer still attached refuses to save
    # ("QuantizationMethod.GGUF ... is not serializable") and would mark the config as quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok.chat_template = CHAT_TEMPLATE
    stops = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")})
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=stops, pad_token_id=tok.pad_token_id
    )
    model.config.eos_token_id = stops
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(json.dumps({"out": out, "eos_token_id": stops, "dtype": str(model.dtype)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
