"""Fine-tune a torchvision Faster R-CNN on tpu (random weights, synthetic images with one
or two boxes each), the same steps on CPU beside it; the losses of every step and the
weights at the end compared (tpu no farther from CPU than CPU from itself with every
weight one ulp up), then inference on tpu.  torchvision's detection ops (nms,
roi_align and their gradients) run on the device: the run fails if any op took the CPU
fallback.

Needs torchvision, which does not import beside ``torch==2.13.0+cpu``: run it with the
vision venv (``make test-vision`` creates it, or ``pip install torch==2.14.1
torchvision==0.29.1`` then ``pip install -e .``):

    .venv-vision/bin/python examples/vision_detection.py [--steps 4] [--model maskrcnn]

``--model maskrcnn`` fine-tunes ``maskrcnn_resnet50_fpn`` instead (masks too; its mask
targets use ``roi_align``'s adaptive grid).
"""

import argparse
import copy
import sys
import time

import torch
from torchvision.models import detection

import torchtpu


def synthetic_batch(step: int, masks: bool):
    """Two images with boxes around brighter rectangles (the labels: 1..3)."""
    g = torch.Generator().manual_seed(step)
    imgs, targets = [], []
    for h, w in ((120, 150), (100, 130)):
        img = torch.rand(3, h, w, generator=g) * 0.3
        n = int(torch.randint(1, 3, (1,), generator=g))
        boxes, labels, ms = [], [], []
        for _ in range(n):
            x1 = int(torch.randint(0, w // 2, (1,), generator=g))
            y1 = int(torch.randint(0, h // 2, (1,), generator=g))
            x2 = x1 + int(torch.randint(15, w // 2, (1,), generator=g))
            y2 = y1 + int(torch.randint(15, h // 2, (1,), generator=g))
            img[:, y1:y2, x1:x2] += 0.5
            boxes.append([float(x1), float(y1), float(x2), float(y2)])
            labels.append(int(torch.randint(1, 4, (1,), generator=g)))
            m = torch.zeros(h, w, dtype=torch.uint8)
            m[y1:y2, x1:x2] = 1
            ms.append(m)
        t = {"boxes": torch.tensor(boxes), "labels": torch.tensor(labels)}
        if masks:
            t["masks"] = torch.stack(ms)
        imgs.append(img)
        targets.append(t)
    return imgs, targets


def build(name: str):
    torch.manual_seed(0)
    # the samplers keep every anchor and proposal: the losses do not depend on the
    # device's random permutation, so tpu and CPU train on the same samples
    kw = dict(weights=None, weights_backbone=None, num_classes=4,
              rpn_batch_size_per_image=10**6, box_batch_size_per_image=10**6)
    if name == "maskrcnn":
        return detection.maskrcnn_resnet50_fpn(**kw, min_size=160, max_size=200)
    return detection.fasterrcnn_mobilenet_v3_large_320_fpn(**kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", choices=["fasterrcnn", "maskrcnn"], default="fasterrcnn")
    args = ap.parse_args()
    torch.tpu.enable_cpu_fallback = False  # an op without a lowering raises
    cpu = build(args.model)
    dev = copy.deepcopy(cpu).to("tpu")
    # CPU's own float32 noise: the same model with every weight one ulp up.  A random
    # detection model amplifies rounding (the RPN's top-k of near-equal scores picks
    # other proposals), so tpu is held to "no farther from CPU than CPU from itself"
    noise = copy.deepcopy(cpu)
    with torch.no_grad():
        for p in noise.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    runs = ((cpu, "cpu"), (noise, "cpu"), (dev, "tpu"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m, _ in runs]
    ok = True
    t0 = time.time()
    for step in range(args.steps):
        imgs, targets = synthetic_batch(step, args.model == "maskrcnn")
        losses = []
        for (m, device), opt in zip(runs, opts):
            m.train()
            ld = m([i.to(device) for i in imgs],
                   [{k: v.to(device) for k, v in t.items()} for t in targets])
            loss = sum(ld.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        c, n, t = losses
        close = abs(t - c) <= max(2 * abs(n - c), 1e-5 * max(1.0, abs(c)))
        ok &= close
        print(f"step {step}: loss cpu {c:.5f}  tpu {t:.5f}  (cpu 1 ulp up: {n:.5f})"
              f"{'' if close else '  MISMATCH'}  ({time.time() - t0:.0f} s)")

    def drift(m):
        return max(float((p.detach() - q.detach().cpu()).abs().max())
                   for p, q in zip(cpu.parameters(), m.parameters()))

    d_tpu, d_noise = drift(dev), drift(noise)
    print(f"largest weight difference from CPU after {args.steps} steps: tpu {d_tpu:.2e}, "
          f"CPU 1 ulp up {d_noise:.2e}")
    ok &= d_tpu <= max(2 * d_noise, 1e-5)
    dev.eval()
    with torch.no_grad():
        out = dev([i.to("tpu") for i in synthetic_batch(99, False)[0]])
    print("tpu inference:", [{k: tuple(v.shape) for k, v in o.items()} for o in out])
    fallbacks = torchtpu.metrics()["fallbacks"]
    ok &= not fallbacks
    print(f"CPU fallbacks: {dict(fallbacks) or 'none'}")
    print("matches CPU" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
