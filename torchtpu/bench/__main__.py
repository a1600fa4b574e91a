import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("eager", "overhead", "shapes", "compile", "kernels",
                                   "dist", "generate", "quant", "serve"):
        print("usage: python -m torchtpu.bench "
              "{eager|overhead|shapes|compile|kernels|dist|generate|quant|serve} "
              "[options]  (--help per command)")
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "dist":  # tpu_dist vs gloo, launches its own processes
        from torchtpu.bench import dist

        return dist.main(rest)
    if cmd == "generate":  # eager modes on MoE generate(), fresh processes
        from torchtpu.bench import generate

        return generate.main(rest)
    if cmd == "serve":  # vLLM on tpu vs HF generate (the serving venv)
        from torchtpu.bench import serve

        return serve.main(rest)
    if cmd == "quant":  # torchao's quantized matmuls and Llama decode step
        from torchtpu.bench import quant

        return quant.main(rest)
    if cmd == "kernels":
        from torchtpu.bench import kernels

        return kernels.main(rest)
    if cmd == "compile":
        from torchtpu.bench import compile as _compile

        return _compile.main(rest)
    if cmd == "eager":
        from torchtpu.bench import eager

        return eager.main(rest)
    if cmd == "shapes":
        from torchtpu.bench import shapes

        shapes.main(rest)
        return 0
    from torchtpu.bench import overhead

    overhead.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
