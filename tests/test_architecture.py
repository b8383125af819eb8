"""The house rules of t5lite/ (docs/architecture.md), read from the source with `ast`:

- the floors above data/ import only its face, data/edge.py;
- imports run one way, room by room (a sub-room such as runtime/process/ is a room of its
  own): errors <- models/lora, moe, ..., optim <- models/common <- the two families
  (models/encoder_decoder, models/decoder_only) <- models <- data/files, data/sharding,
  formats, runtime/process <- data,
  runtime/checkpointing <- runtime <- inference / interop <- config <- tools <- commands;
  rooms on one floor do not import each other; function-local imports count;
- no room's own modules pass 3,000 lines;
- no import cycle between modules;
- a command never imports another command, and is thin wiring;
- no module passes 400 lines, no function 80, and the training loop's `train` 60;
- the model families are told apart only inside models/ (no isinstance on them elsewhere);
- no project file sends users to the developers' shared folder (they do not have it);
- docs/architecture.md's map names every module in its room, and only files that exist;
- one home per setting: a run's defaults live in configs/runs/*.gin only, the switches'
  in `models.configs.Switches`, bound in configs/models/_switches.gin only.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "t5lite"
COMMANDS = {"train", "eval", "infer", "bench", "data_bench", "info", "convert", "vocab", "deps",
            "demo_data", "plot"}
LAYERS = {"errors": 0, "models.activations": 0, "tools.hlo": 0,
          "models.decoding": 1, "models.moe": 1, "models.layouts": 1, "models.pipeline": 1,
          "models.flops": 1, "models.lora": 1, "optim": 1,
          "models.common": 2,
          "models.encoder_decoder": 3, "models.decoder_only": 3,
          "models": 4,
          "data.files": 5, "data.sharding": 5, "formats": 5, "runtime.process": 5,
          "data": 6, "runtime.checkpointing": 6,
          "runtime": 7, "inference": 8, "interop": 8, "config": 9, "tools": 10}
SUB_ROOMS = {room for room in LAYERS if "." in room}
COMMAND_LAYER = 11
ROOM_LINES = 3000
FAMILY_NAMES = {"T5Config", "DecoderConfig", "EncoderDecoderModel", "DecoderOnlyModel"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: Dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _room(module: str) -> str:
    """'errors', 'models', ..., a sub-room 'runtime.process', 'command:<name>', or 'root'
    (the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[1] in COMMANDS and len(parts) == 2:
        return f"command:{parts[1]}"
    if len(parts) >= 3 and f"{parts[1]}.{parts[2]}" in SUB_ROOMS:
        return f"{parts[1]}.{parts[2]}"
    return parts[1]


def _layer(module: str) -> int:
    room = _room(module)
    if room == "root":
        return -1  # imports nothing; anything may import it
    return COMMAND_LAYER if room.startswith("command:") else LAYERS[room]


def _imports(module: str) -> Set[str]:
    """The t5lite modules `module` imports anywhere in its body (module level or not)."""
    tree = ast.parse(MODULES[module].read_text())
    out = set()
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.append(sub if sub in MODULES else base)
        for name in names:
            while name and name not in MODULES:  # `import t5lite.a.b` names module a.b
                name = name.rpartition(".")[0]
            if name.startswith("t5lite") and name != module:
                out.add(name)
    return out


GRAPH: Dict[str, Set[str]] = {m: _imports(m) for m in MODULES}


def test_every_module_is_in_a_room():
    rooms = {_room(m) for m in MODULES}
    assert rooms - {"root"} - set(LAYERS) <= {f"command:{c}" for c in COMMANDS}, rooms
    assert not GRAPH["t5lite"], "t5lite/__init__.py must import nothing"


def test_imports_run_one_way():
    against = []
    for module, targets in GRAPH.items():
        for target in targets:
            if _layer(target) > _layer(module):
                against.append(f"{module} -> {target}")
            elif _room(module).startswith("command:") and _room(target).startswith("command:"):
                against.append(f"{module} -> {target} (a command borrows from another)")
            elif (_layer(target) == _layer(module) and _room(target) != _room(module)
                  and "root" not in (_room(module), _room(target))):
                against.append(f"{module} -> {target} (rooms on one floor)")
    assert not against, "imports against the floors (LAYERS):\n" + "\n".join(sorted(against))


def test_the_floor_rule_holds_sub_rooms_apart():
    assert _room("t5lite.runtime.process.distributed") == "runtime.process"
    assert _room("t5lite.runtime.loop") == "runtime"
    assert _room("t5lite.data.files") == "data.files"
    assert _layer("t5lite.runtime.checkpointing.checkpoints") > _layer("t5lite.formats.t5x_params")
    assert _layer("t5lite.runtime.process.distributed") < _layer("t5lite.runtime.loop")


DATA_FACE = "t5lite.data.edge"


def _behind_the_data_face(graph: Dict[str, Set[str]]) -> List[str]:
    """Imports of a data/ module other than its face from outside data/."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if not module.startswith("t5lite.data")
                  for target in targets
                  if target.startswith("t5lite.data") and target != DATA_FACE)


def test_the_floors_above_data_use_only_its_face():
    """Outside data/, the one data module imported is its face, data/edge.py: what data/
    offers the floors above is listed there, and TensorFlow loads behind it."""
    assert not _behind_the_data_face(GRAPH), "\n".join(_behind_the_data_face(GRAPH))
    assert any(DATA_FACE in targets for targets in GRAPH.values())
    # the check itself: a module above that reached behind the face is named
    reached = dict(GRAPH, **{"t5lite.inference.predict":
                             GRAPH["t5lite.inference.predict"] | {"t5lite.data.pipeline"}})
    assert _behind_the_data_face(reached) == ["t5lite.inference.predict -> t5lite.data.pipeline"]


def test_no_room_over_3000_lines():
    lines: Dict[str, int] = {}
    for module, path in MODULES.items():
        lines[_room(module)] = lines.get(_room(module), 0) + len(path.read_text().splitlines())
    assert not {r: n for r, n in lines.items() if n > ROOM_LINES}, lines


def _strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: List[Tuple[str, List[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles():
    assert _strongly_connected(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m).startswith("command:")))
def test_commands_are_thin(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 100, f"{MODULES[module]} has {lines} lines: move library code out"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(REPO)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_no_function_over_80_lines_and_train_in_one_screen():
    long, train_lines = [], None
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
                if module == "t5lite.runtime.loop" and node.name == "train":
                    train_lines = n
    assert not long, long
    assert train_lines is not None and train_lines <= 60, train_lines


def test_model_families_are_told_apart_only_in_models():
    found = []
    for module, path in MODULES.items():
        if _room(module) == "models":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("isinstance", "issubclass")):
                names = {n.id if isinstance(n, ast.Name) else n.attr
                         for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}
                if names & FAMILY_NAMES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, "ask the model (or its config) instead of branching on its type: " \
                      + ", ".join(found)


# What reads a t5lite step's files: its record (`read_record`), its Orbax metadata
# (`item_metadata_tree`), its arrays (Orbax's PyTree / Standard restores), its data position
# (the data item's JSON). Only formats/t5lite_step.py uses them, besides the modules that
# define them and T5X's own Orbax layout (formats/t5x_checkpoint.py reads T5X's checkpoints,
# never a t5lite step). The data iterators' files are their own item, read by
# runtime/checkpointing/data_iterator_item.py.
STEP_READING = {"read_record", "item_metadata_tree", "PyTreeCheckpointer",
                "StandardCheckpointer", "PyTreeRestore", "StandardRestore", "JsonRestore",
                "DATA_ITEM"}
STEP_READERS = {"t5lite.formats.t5lite_step": STEP_READING,
                "t5lite.formats.fingerprints": {"read_record"},
                "t5lite.formats.checkpoint_trees": {"item_metadata_tree"},
                "t5lite.formats.checkpoint_files": {"DATA_ITEM"},
                "t5lite.formats.t5x_checkpoint": {"item_metadata_tree", "PyTreeCheckpointer",
                                                  "PyTreeRestore"},
                # writes the data item (JsonSave) and names it among the manager's items
                "t5lite.runtime.checkpointing.checkpoints": {"DATA_ITEM"}}


def _names_used(path: Path) -> Set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
            else n.name for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.Name, ast.Attribute, ast.alias))}


def test_one_module_reads_a_checkpoint_step():
    found = []
    for module, path in MODULES.items():
        used = {name.split(".")[-1] for name in _names_used(path)} & STEP_READING
        extra = used - STEP_READERS.get(module, set())
        if extra:
            found.append(f"{module}: {', '.join(sorted(extra))}")
    assert not found, ("read a checkpoint step through formats/t5lite_step.T5liteStep "
                       "(or open_checkpoint): " + "; ".join(found))
    fake = ast.parse("from orbax.checkpoint import PyTreeCheckpointer as P\nx.JsonRestore()")
    assert {"PyTreeCheckpointer", "JsonRestore"} <= {
        n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.name
        for n in ast.walk(fake) if isinstance(n, (ast.Name, ast.Attribute, ast.alias))}


def test_no_project_file_sends_users_to_shared():
    needle = "shared" + "/"  # not spelled out, so this file does not match itself
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix not in (".py", ".md", ".gin", ".sh", ".sub",
                                                     ".txt", ".cfg", ".toml", ".ini", ""):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if needle in line and "t5lite_demo" not in line:
                hits.append(f"{name}:{n}: {line.strip()}")
    assert not hits, "restate what users need in docs/ instead:\n" + "\n".join(hits)


def _map() -> Dict[str, Set[str]]:
    """docs/architecture.md's rooms block: room ('' for the top level: the commands;
    'runtime/process' for a sub-room) -> the names on its lines (`x.py` and bare words)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## The rooms", 1)[1].split("```", 2)[1]
    rooms: Dict[str, Set[str]] = {"": set()}
    room = ""
    for line in block.splitlines():
        start = re.match(r"^  ([\w/]+)/(\s|$)", line)
        if start:
            room = start.group(1)
            rooms.setdefault(room, set())
        elif re.match(r"^  \S", line):
            room = ""
        # the names column: up to the first run of 3+ spaces after the room (descriptions
        # follow it), and every name.py anywhere on the line
        rooms[room].update(re.findall(r"[\w]+\.py", line))
        if room == "" and not line.startswith("t5lite/"):
            rooms[room].update(re.split(r"\s+", re.split(r"\s{3,}", line.strip())[0]))
    return rooms


def test_the_map_names_every_module_in_its_room():
    rooms = _map()
    missing = []
    for module, path in MODULES.items():
        room = _room(module)
        if path.name == "__init__.py":
            continue
        if room.startswith("command:"):
            if room.split(":")[1] not in rooms[""]:
                missing.append(f"{module} (a command: name it on the commands' lines)")
        elif path.name not in rooms.get("" if room == "root" else room.replace(".", "/"),
                                        set()):
            missing.append(f"{path.relative_to(REPO)} (under {room.replace('.', '/')}/)")
    assert not missing, "docs/architecture.md's map lacks:\n" + "\n".join(missing)


def test_the_map_names_only_files_that_exist():
    stale = [f"{room}/{name}" for room, names in _map().items() for name in names
             if name.endswith(".py") and not (PACKAGE / room / name).is_file()]
    assert not stale, "docs/architecture.md's map names files that do not exist: " + \
        ", ".join(stale)


CONFIGS = REPO / "configs"


def _bound_only_at_home(macros, home):
    """{(config class, field)} bound in `home`, each to its macro; a binding of one of
    `macros`' fields in any other config fails."""
    binding = re.compile(r"^(?:t5lite\.)?(T5Config|DecoderConfig)\.(\w+)\s*=\s*(.*)$", re.M)
    found = set()
    for path in CONFIGS.rglob("*.gin"):
        for cls, field, value in binding.findall(path.read_text()):
            if field in macros:
                assert path == home, f"{path.relative_to(CONFIGS)} binds {cls}.{field}"
                assert value.split("#")[0].strip() == f"%{macros[field]}"
                found.add((cls, field))
    return found


def test_switch_bindings_have_one_home():
    """configs/models/_switches.gin binds every switch of both config classes to its macro;
    no other config binds a switch field (it sets the macro)."""
    from t5lite.models import configs
    switches = configs.switch_macros()
    found = _bound_only_at_home(switches, CONFIGS / "models" / "_switches.gin")
    assert found == {(cls, f) for cls in ("T5Config", "DecoderConfig") for f in switches}


def test_moe_settings_have_one_home_and_their_fields_defaults():
    """Every mixture-of-experts field carries its macro (`moe_settings.MoeFields`), as the
    switches do; configs/models/_moe.gin defines each macro at the field's default and binds
    it to the field of both config classes (an encoder-only field to T5Config alone); no
    other config binds an MoE field (it sets the macro)."""
    from t5lite.models import configs
    from t5lite.models.moe import settings as moe_settings
    macros = configs.moe_macros()
    fields = {f.name: f for f in dataclasses.fields(moe_settings.MoeFields)}
    assert set(macros) == set(fields)  # every field has one
    home = CONFIGS / "models" / "_moe.gin"
    defined = dict(re.findall(r"^([A-Z_]+)\s*=\s*([^#\n]+)", home.read_text(), re.M))
    for field, macro in macros.items():
        assert ast.literal_eval(defined[macro].strip()) == fields[field].default, macro
    found = _bound_only_at_home(macros, home)
    assert found == {(cls, f) for cls in ("T5Config", "DecoderConfig") for f in macros
                     if cls == "T5Config" or f not in moe_settings.ENCODER_ONLY}


RUN_SETTINGS = ("train", "evaluate", "infer", "MeshSettings", "CheckpointSettings",
                "InferenceEvalSettings", "DecodingSettings", "DataSettings")


def test_run_defaults_have_one_home():
    """A value configs/runs/*.gin gives a run's entry function or settings class is stated
    there only: the Python parameter it binds has no default (or None: not set). Before,
    LOG_PERIOD, CHECKPOINT_PERIOD, KEEP_CHECKPOINTS, the mesh shapes and the decoding
    settings were stated in both."""
    import inspect
    from t5lite.config import registry
    binding = re.compile(r"^(?:t5lite\.)?(\w+)\.(\w+)\s*=", re.M)
    restated, checked = [], 0
    for path in sorted((CONFIGS / "runs").glob("*.gin")):
        for name, param in binding.findall(path.read_text()):
            if name not in RUN_SETTINGS:
                continue
            obj = getattr(registry, name)
            signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
            default = signature.parameters[param].default
            checked += 1
            if default is not inspect.Parameter.empty and default is not None:
                restated.append(f"runs/{path.name}: {name}.{param} (Python: {default!r})")
    assert checked > 40 and not restated, restated


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_command_says_what_it_does_in_whole_sentences(module):
    """`--help` states the command's docstring's whole first paragraph (its first line
    alone stopped mid-sentence: 'convert a local Hugging Face model directory or a
    T5X')."""
    import subprocess
    import sys
    doc = ast.get_docstring(ast.parse((REPO / "t5lite" / f"{module}.py").read_text()))
    first = " ".join(doc.strip().split("\n\n")[0].split())
    assert first.endswith((".", ")", ".)")), first
    proc = subprocess.run([sys.executable, "-m", f"t5lite.{module}", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert first in " ".join(proc.stdout.split()), proc.stdout
