"""An import-linter contract of dpro's own (``[tool.importlinter] contract_types``).

``names_from``: only the ``readers`` import from ``module`` anything but its ``public`` names.
dpro uses it so that nothing below the CLI opens a run's files itself: the names of the run's
files and the raw readers (``META_FILE``, ``read_json``...) stay with the run format, the
collectors that write them and the loader; the rest reads through ``Run`` and ``RunAnalysis``.
The names are read from the importers' ``from module import ...`` statements (all their lines,
which import-linter's import details do not give).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
from pathlib import Path

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class NamesFromContract(Contract):
    type_name = "names_from"

    module = fields.StringField()
    readers = fields.ListField(subfield=fields.StringField())  # module names, fnmatch patterns allowed
    public = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        broken = []
        for importer in sorted(graph.find_modules_that_directly_import(self.module)):
            if any(fnmatch.fnmatchcase(importer, pattern) for pattern in self.readers):
                continue
            for line, name in _names_imported(importer, self.module):
                if name not in self.public:
                    broken.append({"importer": importer, "name": name, "line": line})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error(f"Only the readers of the run's files import these names from {self.module}:", bold=False)
        output.new_line()
        for b in check.metadata["broken"]:
            output.print_error(f"- {b['importer']} imports {b['name']} (l.{b['line']})", bold=False)
            output.new_line()


def _names_imported(importer: str, module: str) -> list[tuple[int, str]]:
    spec = importlib.util.find_spec(importer)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    tree = ast.parse(Path(spec.origin).read_bytes())
    return [(node.lineno, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == module and not node.level for alias in node.names]
