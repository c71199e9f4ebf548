"""pytorch/examples' word_language_model, shrunk, with burst added the way docs/own-loop.md says.

A text file (``--data DIR/train.txt``, ``valid.txt``) is tokenised into a word stream and
batchified into columns; each micro-batch is a ``bptt``-long slice of it, and the LSTM's
hidden state runs on from slice to slice (``repackage_hidden`` cuts the graph, not the
values) and starts afresh each epoch. After each epoch the validation loss decides
whether to divide the learning rate by four, against the best one so far.

burst calls ``get_batch`` for each offset of the epoch (``run.batches(..., over=...)``)
and carries the hidden state and the best validation loss from step to step
(``run.attach(..., carry=...)``): a killed and restarted run ends bit-identical to one
that never stopped. ``--write-data N`` writes train and valid texts of N words and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

import torch
from torch import nn

import burst

WORDS = ("the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "log", "and", "then")


class Corpus:
    """The example's Dictionary and Corpus: a word id per token, <eos> per line."""

    def __init__(self, directory: Path) -> None:
        self.ids: dict[str, int] = {}
        self.train = self.tokenize(directory / "train.txt")
        self.valid = self.tokenize(directory / "valid.txt")

    def tokenize(self, path: Path) -> torch.Tensor:
        tokens = []
        for line in path.read_text().splitlines():
            for word in [*line.split(), "<eos>"]:
                tokens.append(self.ids.setdefault(word, len(self.ids)))
        return torch.tensor(tokens, dtype=torch.int64)


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int = 16, nhid: int = 16, nlayers: int = 2,
                 dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, data: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        output, hidden = self.rnn(self.drop(self.encoder(data)), hidden)
        return self.decoder(self.drop(output)).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Wrap hidden states in new tensors, to detach them from their history."""
    return tuple(v.detach() for v in h)


def write_data(directory: Path, words: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for name, count in (("train.txt", words), ("valid.txt", words // 4)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
                 for _ in range(count // 6)]
        (directory / name).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", default=None, help="default: $BURST_RUN_ID")
    p.add_argument("--store", default=None, help="default: $BURST_STORE or ./.burst")
    p.add_argument("--data", type=Path, default=Path("data"))
    p.add_argument("--write-data", type=int, default=0, help="write N words and exit")
    p.add_argument("--records", default=os.devnull)
    p.add_argument("--final", default=None)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--bptt", type=int, default=5)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--persist-every", type=int, default=3)
    args = p.parse_args(argv)
    if args.write_data:
        write_data(args.data, args.write_data)
        return
    torch.manual_seed(1111)
    corpus = Corpus(args.data)
    train_data, val_data = batchify(corpus.train, args.batch_size), batchify(corpus.valid, 2)
    model = RNNModel(len(corpus.ids))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)

    def evaluate() -> float:
        model.eval()
        total, hidden = 0.0, model.init_hidden(2)
        with torch.no_grad():
            for i in range(0, val_data.size(0) - 1, args.bptt):
                data, targets = get_batch(val_data, i, args.bptt)
                output, hidden = model(data, hidden)
                total += len(data) * criterion(output, targets).item()
        model.train()
        return total / (len(val_data) - 1)

    run = burst.Run(args.run_id, store=args.store,  # burst: a micro-batch is one bptt slice
                    global_batch=args.batch_size * args.accumulation,
                    micro_batch=args.batch_size, shadow_every=1,
                    persist_every=args.persist_every, keep=100)
    carry = {"hidden": model.init_hidden(args.batch_size), "best_val": None}
    run.attach(model, optimizer, carry=carry)  # burst: restore-or-start, carry included
    offsets = range(0, train_data.size(0) - 1, args.bptt)
    with open(args.records, "a") as records:
        for epoch in run.epochs(args.epochs):  # burst
            if run.samples_in_epoch == 0:  # a fresh epoch, not one resumed midway
                carry["hidden"] = model.init_hidden(args.batch_size)
            for step in run.batches(lambda i: get_batch(train_data, i, args.bptt),
                                    over=offsets):  # burst: the epoch's slices, in order
                hidden, losses = carry["hidden"], []
                optimizer.zero_grad()
                for data, targets in step:
                    hidden = repackage_hidden(hidden)
                    output, hidden = model(data, hidden)
                    loss = criterion(output, targets) / step.micro_batches
                    loss.backward()
                    losses.append(loss.detach())
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                optimizer.step()
                carry["hidden"] = hidden  # burst: what the next step starts from
                records.write(json.dumps({"step": step.index, "epoch": epoch,
                                          "loss": float(sum(losses)).hex()}) + "\n")
                records.flush()
            val_loss = evaluate()
            if carry["best_val"] is None or val_loss < carry["best_val"]:
                carry["best_val"] = val_loss
            else:
                for group in optimizer.param_groups:
                    group["lr"] /= 4.0
    run.close()  # burst: final snapshot
    if args.final:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "hidden": carry["hidden"]}, args.final)


if __name__ == "__main__":
    main()
