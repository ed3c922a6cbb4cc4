"""Command line of d2lmini.

    python -m d2lmini data [--no-download]   find and verify (or download) Fashion-MNIST
    python -m d2lmini corpus [--no-download] [--deb FILE]
                                             obtain and verify the GPT chapter's Jane Austen text
    python -m d2lmini doctor [--json] [-f FW] [--require FW[,FW]]
                                             what each framework sees here, and what to fix
"""
import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m d2lmini")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="find, verify (or download) Fashion-MNIST")
    d.add_argument("--no-download", action="store_true", help="fail instead of downloading")
    c = sub.add_parser("corpus", help="obtain and verify the Jane Austen corpus (d2lmini.gpt)")
    c.add_argument("--no-download", action="store_true", help="fail instead of downloading")
    c.add_argument("--deb", help="decode this r-cran-janeaustenr .deb instead of fetching it")
    from . import doctor
    doc = sub.add_parser("doctor", help="check the frameworks against this machine's GPUs",
                         description=doctor.__doc__.split("\n")[0])
    doctor.add_arguments(doc)
    args = p.parse_args(argv)
    if args.cmd == "doctor":
        return doctor.run(args)
    if args.cmd == "corpus":
        from .data import DataError
        from .gpt.corpus import load_corpus, obtain_corpus
        try:
            path = obtain_corpus(not args.no_download, args.deb)
            print(f"{load_corpus(path)!r} verified in {path}")
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0

    from .data import DataError, find_data_dir, load_fashion_mnist
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
