"""The assistant: a base model, its memory adapter, and the library, put together for a user.

This is what the CLI (and later the TUI) call: open a model with its adapter, ingest a path into
the library (or reuse the stored state), answer questions about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from edgemem.armt import (
    ARMT,
    ARMTConfig,
    IngestResult,
    Progress,
    alignment_ends,
    ingest,
    override_config,
    read_adapter,
    tokenize_stream,
)
from edgemem.documents import Scan, iter_text
from edgemem.errors import EdgememError
from edgemem.models import DEFAULT_MODEL, LoadedModel, load_model
from edgemem.runtime import OrtOptions, Runtime, TorchRuntime, answer, open_engine
from edgemem.store import Library, Record

SHIPPED_ADAPTERS = Path(__file__).parent / "adapters"
CHECKPOINT_EVERY_S = 30.0  # an unfinished ingest is saved this often (and when cancelled or interrupted)


def shipped_adapter(model_name: str) -> Path | None:
    """The adapter file shipped with edgemem for a bundled model, if one exists."""
    path = SHIPPED_ADAPTERS / f"{model_name}.safetensors"
    return path if path.is_file() else None


@dataclass
class Assistant:
    """What a user talks to. `runtime` runs the model (PyTorch on `loaded` + `armt` by default, or
    an ONNX engine bundle: then `loaded` and `armt` are None and no PyTorch model is loaded)."""

    loaded: LoadedModel | None
    armt: ARMT | None
    adapter_path: Path | None  # None: freshly initialised (untrained) memory
    adapter_hash: str
    runtime: Runtime = None  # type: ignore[assignment]  # set in __post_init__ when not given

    def __post_init__(self) -> None:
        if self.runtime is None:
            if self.loaded is None or self.armt is None:
                raise EdgememError("an assistant needs a model or a runtime")
            self.runtime = TorchRuntime(self.loaded, self.armt, self.adapter_hash)

    @cached_property
    def sentence_ends(self) -> frozenset[int]:
        """The tokenizer's `sentence_end_ids` when the memory aligns its segments (else empty),
        found once per assistant: every ingest needs them."""
        return alignment_ends(self.runtime.config, self.runtime.tokenizer)

    @classmethod
    def open(
        cls,
        model: str = DEFAULT_MODEL,
        adapter: str | Path | None = None,
        segment_len: int | None = None,
        dtype: torch.dtype | None = None,
        answer_window: int | None = None,
        segment_align: int | None = None,
    ) -> Assistant:
        """The PyTorch assistant; `dtype` None picks bf16 where it is native, else float32;
        `segment_len`, `answer_window` and `segment_align` None: the adapter's own (`ARMTConfig`;
        `armt.override_config` says how a `segment_len` scales the adapter's alignment)."""
        adapter_path = Path(adapter).expanduser() if adapter else None
        adapter_file = read_adapter(adapter_path) if adapter_path else None  # fail before the slow load
        loaded = load_model(model, dtype)
        if adapter_file is None and (adapter_path := shipped_adapter(loaded.name)) is not None:
            adapter_file = read_adapter(adapter_path)
        if adapter_file is not None:
            config, tensors = adapter_file
        else:
            config, tensors = ARMTConfig.for_model(loaded.model.config.num_hidden_layers), None
        config = override_config(config, segment_len, segment_align, answer_window)
        armt = ARMT(loaded.model, config)
        if tensors is not None:
            armt.load_adapter_tensors(tensors)
        return cls(loaded, armt, adapter_path, armt.adapter_hash())

    @classmethod
    def open_engine(
        cls,
        engine: str | Path,
        model: str | None = None,
        adapter: str | Path | None = None,
        options: OrtOptions | None = None,
    ) -> Assistant:
        """An assistant on an engine bundle (`edgemem export`: ONNX Runtime, or TensorRT when it
        holds plans); `model` and `adapter`, when given, must be the ones it was exported from."""
        runtime = open_engine(engine, model=model, adapter=adapter, options=options)
        adapter_path = Path(adapter).expanduser() if adapter else None
        return cls(None, None, adapter_path, runtime.adapter_hash, runtime)

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def trained(self) -> bool:
        return self.runtime.trained

    def ingest_scan(
        self,
        source: Scan,
        library: Library,
        progress: Callable[[Progress], None] | None = None,
        force: bool = False,
        *,
        should_stop: Callable[[], bool] | None = None,
        notice: Callable[[str], None] | None = None,
        checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    ) -> tuple[Record, IngestResult, bool]:
        """Ingest a scanned path, or reuse its stored state. -> (record, document, reused).

        An unfinished earlier ingest of the same content, model and adapter (cancelled with
        `should_stop`, interrupted, or killed) is resumed from its last checkpoint; `force` starts
        from the beginning. `notice` hears about resuming and about a damaged checkpoint.
        """
        key = self.library_key(source.content_hash)
        shapes = self.runtime.state_shapes()
        state_type = type(self.runtime.empty_state())  # MemoryState, or SwaxState for a SWAX model
        record = None if force else library.find(*key)
        if record is not None:
            return record, library.load(record, shapes, state_type), True
        path = str(source.root.resolve())
        state, start = None, 0
        checkpoint = library.find_checkpoint(*key)
        if checkpoint is not None and force:
            library.drop_checkpoint(*key)
        elif checkpoint is not None:
            try:
                state, start = (
                    library.load_checkpoint(checkpoint, shapes, state_type),
                    checkpoint.tokens,
                )
            except EdgememError as exc:
                library.drop_checkpoint(*key)
                if notice is not None:
                    notice(f"{exc}; starting the ingest from the beginning")
            else:
                if notice is not None:
                    notice(f"resuming the ingest of {path} from {start:,} tokens")
        tokens = tokenize_stream(iter_text(source), self.runtime.tokenizer)
        doc = ingest(
            self.runtime,
            tokens,
            state,
            progress,
            start_tokens=start,
            checkpoint=lambda state, n: library.save_checkpoint(path, *key, state, n),
            checkpoint_every_s=checkpoint_every_s,
            should_stop=should_stop,
            ends=self.sentence_ends,
        )
        record = library.save(path, *key, doc)
        return record, doc, False

    def library_key(self, content_hash: str) -> tuple[str, str, str]:
        """(content hash, model id, adapter hash): the key of a document's state in the library."""
        return content_hash, self.runtime.model_id, self.adapter_hash

    def ask(self, doc: IngestResult, question: str, **generation) -> Iterator[str]:
        return answer(self.runtime, doc, question, **generation)
