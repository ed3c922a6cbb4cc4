"""Tag the code cells that define a chapter's step functions with ``step:<name>``.

    .venv/bin/python -m tools.tag_steps

The framework tabs (``{framework-tabs} CHAPTER STEP`` in the book's pages) show the cells
tagged ``step:STEP`` in the four notebooks of CHAPTER; tests/test_steps.py checks that every
notebook of a chapter tags the same steps.  A cell is tagged when it defines, at top level,
one of the functions its chapter's manifest entry lists (``Chapter.steps``).  Idempotent.
"""
import ast
import json

from tools.manifest import CHAPTERS, ROOT

STEPS = {c.name: c.steps for c in CHAPTERS if c.steps}  # chapter -> {function: step name}


def defined_functions(src: str) -> set[str]:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def main():
    for chapter, steps in STEPS.items():
        for nb_path in sorted((ROOT / "chapters" / chapter).glob("*.ipynb")):
            nb = json.loads(nb_path.read_text())
            for cell in nb["cells"]:
                if cell["cell_type"] != "code":
                    continue
                tags = [t for t in cell.get("metadata", {}).get("tags", []) if not t.startswith("step:")]
                tags += [f"step:{steps[f]}" for f in sorted(defined_functions("".join(cell["source"])))
                         if f in steps]
                if tags:
                    cell.setdefault("metadata", {})["tags"] = tags
                elif "tags" in cell.get("metadata", {}):
                    del cell["metadata"]["tags"]
            nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            print(nb_path.relative_to(ROOT), sorted({t for c in nb["cells"]
                  for t in c.get("metadata", {}).get("tags", []) if t.startswith("step:")}))


if __name__ == "__main__":
    main()
