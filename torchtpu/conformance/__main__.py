"""``python -m torchtpu.conformance {ops,models,vision} [args]``.

* ``ops``    -- the OpInfo sweep (:mod:`torchtpu.conformance.opinfo`);
* ``models`` -- the Hugging Face architecture sweep (:mod:`torchtpu.conformance.models`);
* ``vision`` -- the torchvision classification sweep (:mod:`torchtpu.conformance.vision`).
"""

import sys

_USAGE = "usage: python -m torchtpu.conformance {ops,models,vision} [--help | args...]"


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
    print(f"unknown subcommand {cmd!r}\n{_USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
