"""The assistant: a base model, its memory adapter, and the library, put together for a user.

This is what the CLI (and later the TUI) call: open a model with its adapter, ingest a path into
the library (or reuse the stored state), answer questions about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from edgemem.armt import (
    ARMT,
    ARMTConfig,
    IngestResult,
    Progress,
    answer,
    ingest,
    read_adapter,
    tokenize_stream,
)
from edgemem.documents import Scan, iter_text
from edgemem.errors import EdgememError
from edgemem.models import DEFAULT_MODEL, LoadedModel, load_model
from edgemem.store import Library, Record

SHIPPED_ADAPTERS = Path(__file__).parent / "adapters"
CHECKPOINT_EVERY_S = 30.0  # an unfinished ingest is saved this often (and when cancelled or interrupted)


def shipped_adapter(model_name: str) -> Path | None:
    """The adapter file shipped with edgemem for a bundled model, if one exists."""
    path = SHIPPED_ADAPTERS / f"{model_name}.safetensors"
    return path if path.is_file() else None


@dataclass
class Assistant:
    loaded: LoadedModel
    armt: ARMT
    adapter_path: Path | None  # None: freshly initialised (untrained) memory
    adapter_hash: str

    @classmethod
    def open(
        cls, model: str = DEFAULT_MODEL, adapter: str | Path | None = None, segment_len: int | None = None
    ) -> Assistant:
        adapter_path = Path(adapter).expanduser() if adapter else None
        adapter_file = read_adapter(adapter_path) if adapter_path else None  # fail before the slow load
        loaded = load_model(model)
        if adapter_file is None and (adapter_path := shipped_adapter(loaded.name)) is not None:
            adapter_file = read_adapter(adapter_path)
        if adapter_file is not None:
            config, tensors = adapter_file
        else:
            config, tensors = ARMTConfig.for_model(loaded.model.config.num_hidden_layers), None
        if segment_len is not None:
            config = replace(config, segment_len=segment_len)
        armt = ARMT(loaded.model, config)
        if tensors is not None:
            armt.load_adapter_tensors(tensors)
        return cls(loaded, armt, adapter_path, armt.adapter_hash())

    @property
    def trained(self) -> bool:
        return self.armt.is_trained()

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
        key = (source.content_hash, self.loaded.model_id, self.adapter_hash)
        record = None if force else library.find(*key)
        if record is not None:
            return record, library.load(record, self.armt.state_shapes()), True
        path = str(source.root.resolve())
        state, start = None, 0
        checkpoint = library.find_checkpoint(*key)
        if checkpoint is not None and force:
            library.drop_checkpoint(*key)
        elif checkpoint is not None:
            try:
                state, start = (
                    library.load_checkpoint(checkpoint, self.armt.state_shapes()),
                    checkpoint.tokens,
                )
            except EdgememError as exc:
                library.drop_checkpoint(*key)
                if notice is not None:
                    notice(f"{exc}; starting the ingest from the beginning")
            else:
                if notice is not None:
                    notice(f"resuming the ingest of {path} from {start:,} tokens")
        tokens = tokenize_stream(iter_text(source), self.loaded.tokenizer)
        doc = ingest(
            self.armt,
            tokens,
            state,
            progress,
            start_tokens=start,
            checkpoint=lambda state, n: library.save_checkpoint(path, *key, state, n),
            checkpoint_every_s=checkpoint_every_s,
            should_stop=should_stop,
        )
        record = library.save(path, *key, doc)
        return record, doc, False

    def ask(self, doc: IngestResult, question: str, **generation) -> Iterator[str]:
        return answer(self.armt, self.loaded.tokenizer, doc, question, **generation)
