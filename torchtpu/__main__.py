"""``python -m torchtpu <command>``: ``info`` (environment report for bug reports)."""

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m torchtpu info [--json]\n\n"
              "  info   platform, devices, memory, versions, eager mode, caches, integrations")
        return 0 if argv else 2
    if argv[0] == "info":
        from torchtpu._info import main as info_main

        return info_main(argv[1:])
    print(f"python -m torchtpu: unknown command {argv[0]!r} (try: info)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
