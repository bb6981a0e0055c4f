"""Can one memory layer learn recall when everything else is held fixed? A cheap, isolated check.

    python scripts/train_path_probe.py --layer 27 --digits 1 [--oracle] [--steps 300]

SmolLM2 with the untrained (zero) memory is run once, without gradients, over recall items of the
bootstrap task (needle at the end of one 64-token segment, the question in the next): per item it
keeps the layer's write-token outputs m [M, D] (the written segment) and the layer's input
h [T, D] (the answer segment). Then a fresh AssociativeMemory for that layer trains alone: write m,
read into h, run the remaining decoder layers and the head, loss on the answer tokens. Only the
last few layers run per step, so hundreds of steps take minutes.

--oracle replaces the write tokens' outputs by the layer's hidden states at the needle's own last
tokens (where a ridge probe reads the digits back): if the memory learns then but not from the
write tokens, the write path (what the write tokens attend to) is the bottleneck, not the read.
Prints held-out loss and per-token accuracy on the digits every 25 steps.
"""

from __future__ import annotations

import argparse
import math
import random

import torch
import torch.nn.functional as F

from edgemem import train as T
from edgemem.armt import ARMT, ARMTConfig
from edgemem.cli_common import run_script
from edgemem.memory import AssociativeMemory
from edgemem.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layer", type=int, default=27)
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--oracle", action="store_true")
    parser.add_argument("--all-tokens", action="store_true", help="write every token of the segment")
    parser.add_argument("--items", type=int, default=384)
    parser.add_argument("--test-items", type=int, default=96)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    loaded = load_model("smollm2-135m-instruct", dtype=torch.float32)
    base = loaded.model
    config = ARMTConfig.for_model(base.config.num_hidden_layers, norm_inputs=True)
    armt = ARMT(base, config)  # supplies the write embeddings of an untrained memory
    layers = base.model.layers
    L = args.layer
    norm = layers[L].layer.input_layernorm if hasattr(layers[L], "layer") else layers[L].input_layernorm
    M = config.num_write_tokens

    train_config = T.TrainConfig.from_dict(
        {
            "model": "smollm2-135m-instruct",
            "stage": [{"name": "b", "task": "recall", "steps": 1, "segment_len": 64}],
        }
    )
    tasks = T.ProseTasks(
        loaded.tokenizer, T.cached_stream(loaded.tokenizer, loaded.model_id, train_config, "train")
    )
    stage = T.Stage(
        name="b",
        task="recall",
        steps=1,
        segment_len=64,
        needle="end",
        needle_segment="first",
        tail=8,
        digits=args.digits,
    )
    rng = random.Random(0)
    ms, hs, ts = [], [], []
    n_total = args.items + args.test_items
    with torch.no_grad():
        for i in range(n_total):
            doc, prompt, answer = tasks.recall_item(rng, stage, 64, 1)
            written = torch.tensor([doc[:64]])
            embeds = armt._embed(written, write=True)  # the segment, then the M write embeddings
            hid = base.model(inputs_embeds=embeds, output_hidden_states=True, use_cache=False).hidden_states
            if args.all_tokens:  # the segment's tokens and the write tokens
                m = norm(hid[L + 1][0])
            elif args.oracle:  # the needle's last tokens (the number and its full stop) at layer L's output
                m = norm(hid[L + 1][0, 64 - M : 64])
            else:
                m = norm(hid[L + 1][0, 64:])
            ids = torch.tensor([prompt + answer])
            h = base.model(ids, output_hidden_states=True, use_cache=False).hidden_states[L]
            target = torch.full((ids.shape[1],), -100)
            target[len(prompt) - 1 : ids.shape[1] - 1] = torch.tensor(answer)
            ms.append(m)
            hs.append(h[0])
            ts.append(target)
            if (i + 1) % 64 == 0:
                print(f"prepared {i + 1}/{n_total} items", flush=True)

    memory = AssociativeMemory(base.config.hidden_size, config.d_mem, config.nu)
    optimizer = torch.optim.AdamW(memory.parameters(), lr=args.lr, weight_decay=0.0)
    rotary = base.model.rotary_emb
    head = base.get_output_embeddings()
    for p in base.parameters():
        p.requires_grad_(False)

    def loss_of(idx: list[int]) -> tuple[torch.Tensor, float, float]:
        T_max = max(hs[i].shape[0] for i in idx)
        h = torch.stack([F.pad(hs[i], (0, 0, 0, T_max - hs[i].shape[0])) for i in idx])
        tgt = torch.stack([F.pad(ts[i], (0, T_max - ts[i].shape[0]), value=-100) for i in idx])
        m = torch.stack([ms[i] for i in idx])  # [B, M or S + M, D]
        A, z = memory.empty_state(len(idx))
        A, z = memory.write(m, A, z, first=True)
        read = memory.read(norm(h), A, z) * h.pow(2).mean(-1, keepdim=True).sqrt()
        x = h + read
        pos = torch.arange(T_max).unsqueeze(0).expand(len(idx), -1)
        pe = rotary(x, pos)
        for j in range(L, len(layers)):
            layer = layers[j].layer if hasattr(layers[j], "layer") else layers[j]
            x = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        x = base.model.norm(x)
        mask = tgt != -100
        logits = head(x[mask])
        loss = F.cross_entropy(logits, tgt[mask])
        gold = tgt[mask]
        is_digit = torch.isin(gold, digit_ids)  # digits only: the answer's digit tokens
        acc = (logits.argmax(-1) == gold)[is_digit].float().mean().item()
        digit_loss = F.cross_entropy(logits[is_digit], gold[is_digit]).item()
        return loss, acc, digit_loss

    digit_ids = torch.tensor(
        sorted(
            {int(t) for t in torch.cat(ts) if t >= 0 and loaded.tokenizer.decode([int(t)]).strip().isdigit()}
        )
    )
    train_idx = list(range(args.items))
    test_idx = list(range(args.items, n_total))
    print(
        f"layer {L}, digits {args.digits}, oracle={args.oracle}, all tokens={args.all_tokens}; "
        f"chance digit loss ~ {math.log(10):.2f}"
    )
    for step in range(args.steps + 1):
        if step % 25 == 0:
            with torch.no_grad():
                loss, acc, dl = loss_of(test_idx)
            print(
                f"step {step:4d}: held-out loss {loss.item():.3f}, digit loss {dl:.3f}, digit acc {acc:.2f}",
                flush=True,
            )
        if step == args.steps:
            break
        batch = rng.sample(train_idx, args.batch)
        loss, _, _ = loss_of(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    run_script(main)
