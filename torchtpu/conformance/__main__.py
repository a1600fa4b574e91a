"""``python -m torchtpu.conformance {ops,models,vision,modules,optimizers} [args]``.

* ``ops``        -- the OpInfo sweep (:mod:`torchtpu.conformance.opinfo`);
* ``models``     -- the Hugging Face architecture sweep (:mod:`torchtpu.conformance.models`);
* ``vision``     -- the torchvision classification sweep (:mod:`torchtpu.conformance.vision`);
* ``modules``    -- the ``module_db`` sweep (:mod:`torchtpu.conformance.modules`);
* ``optimizers`` -- the ``optim_db`` sweep (:mod:`torchtpu.conformance.optimizers`).
"""

import sys

_USAGE = ("usage: python -m torchtpu.conformance {ops,models,vision,modules,optimizers} "
          "[--help | args...]")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "ops":
        from torchtpu.conformance import opinfo

        return opinfo.main(rest) or 0
    if cmd == "models":
        from torchtpu.conformance import models

        return models.main(rest) or 0
    if cmd == "vision":
        from torchtpu.conformance import vision

        return vision.main(rest) or 0
    if cmd == "modules":
        from torchtpu.conformance import modules

        return modules.main(rest) or 0
    if cmd == "optimizers":
        from torchtpu.conformance import optimizers

        return optimizers.main(rest) or 0
    print(f"unknown subcommand {cmd!r}\n{_USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
