"""The maintainers' tools, a package: ``python -m tools.<name>`` from the repository's root
(``make`` does).  ``tools.manifest`` is the book's one picture (chapters, pages, what each
tool does with them) that the others read; ``tools.notebooks`` reads and runs notebooks."""
