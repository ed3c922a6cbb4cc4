"""Command line: ``python -m d2lmini data [--no-download]`` finds and verifies Fashion-MNIST."""
import argparse
import sys

from .data import DataError, find_data_dir, load_fashion_mnist


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m d2lmini")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="find, verify (or download) Fashion-MNIST")
    d.add_argument("--no-download", action="store_true", help="fail instead of downloading")
    args = p.parse_args(argv)
    try:
        where = find_data_dir(download=not args.no_download)
        load_fashion_mnist()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Fashion-MNIST verified in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
