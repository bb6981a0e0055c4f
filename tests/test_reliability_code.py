"""Nothing executes from data: no pickle (or other code-carrying format) anywhere in edgemem, no
`torch.load` without `weights_only=True`, no `eval`/`exec` builtins, no remote code from model
folders; a model's chat template is rendered in Jinja's immutable sandbox, and a template the
sandbox refuses is one clear error at load time."""

import ast
import json
from pathlib import Path

import pytest
from fuzz.helpers import REPO, tiny_model_folder
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tiny_assistant import tiny_tokenizer
from typer.testing import CliRunner

from edgemem.cli import app

SOURCE_DIRS = ["edgemem", "tui", "export", "kernels", "scripts", "docs"]
CODE_CARRYING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}


def python_files() -> list[Path]:
    files = [p for d in SOURCE_DIRS if (REPO / d).is_dir() for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 20
    return files


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def findings(tree: ast.AST) -> list[str]:
    """What in one module could run code carried by data."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [f"imports {n}" for n in names if n.split(".")[0] in CODE_CARRYING_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if isinstance(func, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
            out.append(f"calls {name}()")
        if (owner, name) == ("torch", "load") and not _is_true(_keyword(node, "weights_only")):
            out.append("torch.load without weights_only=True")
        if owner in ("np", "numpy") and name == "load" and _is_true(_keyword(node, "allow_pickle")):
            out.append("numpy.load(allow_pickle=True)")
        if owner == "yaml" and name in ("load", "unsafe_load", "full_load"):
            out.append(f"yaml.{name}")
        if _is_true(_keyword(node, "trust_remote_code")):
            out.append("trust_remote_code=True")
        if (
            owner == "jinja2"
            and name in ("Environment", "Template")
            or name == "from_string"
            and owner == "jinja2"
        ):
            out.append(f"unsandboxed jinja2.{name}")
        if _is_true(_keyword(node, "shell")):
            out.append("subprocess with shell=True")
    return out


def test_no_code_executing_loaders_anywhere_in_the_source():
    problems = {}
    for path in python_files():
        found = findings(ast.parse(path.read_text(), filename=str(path)))
        if found:
            problems[str(path.relative_to(REPO))] = found
    assert problems == {}


@pytest.mark.parametrize(
    "snippet",
    [
        "import pickle",
        "from joblib import load",
        "eval(text)",
        "exec(code)",
        "torch.load(path)",
        "torch.load(path, weights_only=False)",
        "np.load(path, allow_pickle=True)",
        "AutoModel.from_pretrained(folder, trust_remote_code=True)",
        "yaml.load(text)",
        "jinja2.Environment()",
        "subprocess.run(cmd, shell=True)",
    ],
)
def test_the_scanner_catches_each_pattern(snippet):
    """The scan can fail: each pattern it looks for is found in a one-line example."""
    assert findings(ast.parse(snippet))


def test_the_scanner_leaves_safe_calls_alone():
    assert not findings(ast.parse("model.eval()\ntorch.load(p, weights_only=True)\nnp.load(p)"))


EVIL = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def test_transformers_renders_chat_templates_in_the_immutable_sandbox():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    assert isinstance(_compile_jinja_template("{{ 1 }}").environment, ImmutableSandboxedEnvironment)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = EVIL
    with pytest.raises(SecurityError):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    tokenizer.chat_template = "{% set x = messages.append({'role': 'user'}) %}{{ messages | length }}"
    with pytest.raises(SecurityError):  # immutable: the template cannot change what it is given
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)


@pytest.mark.parametrize(
    "template", [EVIL, "{% for m in messages %}{{ m.content", "{{ raise_exception('no') }}"], ids=repr
)
def test_a_model_whose_chat_template_is_refused_fails_in_one_line_at_load(tmp_path, monkeypatch, template):
    model = tiny_model_folder(tmp_path / "model")
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    doc = tmp_path / "doc.txt"
    doc.write_text("some text\n")
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["ask", str(doc), "what?", "--model", str(model), "--segment-len", "16"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "chat template cannot be used" in errors[0], result.stderr
