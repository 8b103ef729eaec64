"""The package's shape: imports run one way, from records up to the command line.

Each top-level module or folder of `unstable` sits on a layer; a module may import its own layer and the
layers below, never one above. Imports inside functions count too (they are how heavy dependencies load
lazily, not a way around the layering). `docs/architecture.md` draws the same layers.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "unstable"

LAYERS = [
    {"records", "settings", "atomic"},
    {"rl", "tracking", "dashboard", "report", "games", "agents"},
    {"models", "inference", "rewards", "reward_transformations"},
    {"buffer", "pool", "collector"},
    {"algorithms"},
    {"learner"},
    {"evaluation"},
    {"config"},
    {"runtime"},
    {"cli", "terminal_interface", "__init__"},
]
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    """The top-level module or folder of `unstable` that `module` belongs to ('records' for unstable.records)."""
    return module.split(".")[1] if "." in module else "__init__"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: Path) -> set[str]:
    """Every `unstable...` module that `module` imports anywhere in its body."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            submodules = {f"{base}.{alias.name}" for alias in node.names} & set(MODULES)  # from unstable import atomic
            names |= submodules or {base}
    return {name for name in names if name == "unstable" or name.startswith("unstable.")}


MODULES = _modules()


def test_every_part_of_the_package_has_a_layer():
    assert {_part(m) for m in MODULES} <= set(LAYER_OF), "add new folders to LAYERS (and docs/architecture.md)"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module):
    level = LAYER_OF[_part(module)]
    upward = sorted(i for i in _imports(module, MODULES[module]) if LAYER_OF[_part(i)] > level)
    assert not upward, f"{module} (layer {level}) imports from a higher layer: {upward}"


def test_no_algorithm_imports_the_learner():
    for module, path in MODULES.items():
        if module.startswith("unstable.algorithms"):
            assert not {i for i in _imports(module, path) if i.startswith("unstable.learner")}, module


def test_plain_logic_never_imports_ray():
    """Ray appears only in the runtime's wiring; every component is a plain class the tests use directly."""
    for module, path in MODULES.items():
        if not module.startswith("unstable.runtime"):
            tree = ast.parse(path.read_text())
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not {name for name in imported if name == "ray" or name.startswith("ray.")}, module


def test_seed_means_a_random_seed_only():
    """The original UnstableBaselines API and documents are called so ("the original API"), never "the seed":
    in this package a seed is a random seed."""
    pattern = re.compile(r"seed's|seed 00\d|seed (?:script|document|api|keyword)s?\b|from_seed|seed_kwargs", re.I)
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_algorithms_contract_lives_beside_them():
    """`base` (BaseAlgo), `batching` (steps to tensors) and `trainable` (the interface algorithms train through)
    are the algorithms' contract, so they live in `algorithms/`."""
    contract = {f"unstable.algorithms.{name}" for name in ("base", "batching", "trainable")}
    assert contract <= set(MODULES) and not {"unstable.batching", "unstable.trainable"} & set(MODULES)


def _loaded_by(modules: str, watched: set[str]) -> list[str]:
    """Which of the `watched` modules a fresh interpreter has loaded after `import <modules>` (comma-separated)."""
    import json
    import subprocess
    import sys

    probe = f"import json, sys, {modules}; print(json.dumps(sorted({sorted(watched)!r} & sys.modules.keys())))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_importing_the_config_imports_no_torch():
    """`import unstable.config` (the settings of every part) loads neither torch nor Ray: a tool that reads or writes
    configs starts in a fraction of a second (the learner package imported torch with its settings before)."""
    loaded = _loaded_by("unstable.config", {"torch", "ray", "transformers"})
    assert loaded == [], f"import unstable.config loaded {loaded}"


def test_the_light_actors_module_imports_no_torch():
    """A Ray worker imports the module of the actor class it hosts: `runtime.actors` (tracker, buffer, pool,
    collector, checkpoint source, inference server shells) loads no torch, so each of those workers starts without it
    (they imported torch and the learner's modules with the learner's actors: ~6.8 s and ~400 MB each)."""
    loaded = _loaded_by("unstable.runtime.actors", {"torch", "transformers"})
    assert loaded == [], f"import unstable.runtime.actors loaded {loaded}"


def test_the_driver_imports_no_torch():
    """The modules of `unstable train`'s driver import no torch (its resume module imported it for the tensors of a
    state: ~2.8 CPU-s at every start, also for `--resume` of a finished run or one refused before Ray starts)."""
    loaded = _loaded_by("unstable.cli.main, unstable.runtime.driver", {"torch"})
    assert loaded == [], f"the driver's modules loaded {loaded}"


def test_the_learner_actors_module_loads_no_dtensor():
    """`runtime.learner_actors`, which a run's driver imports to start the learner group, loads torch but not torch's
    DTensor module (0.6 s of imports with sympy, at every `unstable train`): only FSDP sharding needs it."""
    loaded = _loaded_by("unstable.runtime.learner_actors", {"torch.distributed.tensor"})
    assert loaded == [], f"import unstable.runtime.learner_actors loaded {loaded}"
