"""Address matching, the kind of model the MGeo migration story trains: are two address
strings the same place? A siamese character-bigram encoder scores pairs of Chinese and
English addresses generated here (a match is the same address rewritten: abbreviated,
reordered, with a typo or without its province; a non-match is a different address).

A plain PyTorch loop; the lines marked ``# burst`` are all burst adds. ``scripts/demo.py``
runs it under ``burst drill`` with an injected CUDA OOM and shows the resumed run ends
where an uninterrupted one does. Trains on a CPU in a few seconds.
"""

import argparse
import random
import zlib

import torch
from torch.utils.data import DataLoader, Dataset

import burst

PROVINCES = {"北京市": ["北京市"], "浙江省": ["杭州市", "宁波市"], "广东省": ["广州市", "深圳市"],
             "四川省": ["成都市"], "江苏省": ["南京市", "苏州市"]}
DISTRICTS = ["朝阳区", "海淀区", "西湖区", "滨江区", "天河区", "南山区", "武侯区", "鼓楼区"]
ROADS = ["建国路", "中关村大街", "文三路", "解放路", "人民路", "科技园路", "天府大道", "中山路"]
TYPOS = {"路": "璐", "区": "曲", "市": "是", "号": "好", "街": "接", "道": "到"}
STREETS = ["Main", "Oak", "Maple", "Park", "Cedar", "Elm", "Lake", "Hill", "Washington"]
KINDS = {"Street": "St", "Avenue": "Ave", "Road": "Rd", "Boulevard": "Blvd"}
CITIES = [("Springfield", "IL"), ("Portland", "OR"), ("Austin", "TX"), ("Boston", "MA"),
          ("Denver", "CO"), ("Seattle", "WA")]
BUCKETS = 4096  # hashed character bigrams
LENGTH = 48


def chinese_address(r: random.Random) -> list[str]:
    province = r.choice(list(PROVINCES))
    return [province, r.choice(PROVINCES[province]), r.choice(DISTRICTS), r.choice(ROADS),
            f"{r.randint(1, 999)}号"]


def english_address(r: random.Random) -> list[str]:
    city, state = r.choice(CITIES)
    return [f"{r.randint(1, 9999)}", r.choice(STREETS), r.choice(list(KINDS)), f"{city},",
            state]


def rewrite(parts: list[str], r: random.Random) -> str:
    """The same place written another way: what address matching must see through."""
    parts = list(parts)
    chinese = parts[-1].endswith("号")
    if chinese:
        if r.random() < 0.4 and parts[0] != parts[1]:
            parts.pop(0)  # no province: 浙江省杭州市... -> 杭州市...
        if r.random() < 0.4:
            parts = [p.removesuffix("市") if p.endswith("市") else p for p in parts]  # 北京市 -> 北京
        if r.random() < 0.3:
            parts[-1] = parts[-1].replace("号", "號")
    else:
        if r.random() < 0.5:
            parts[2] = KINDS.get(parts[2], parts[2])  # Street -> St
        if r.random() < 0.3:
            parts = [p.lower() for p in parts]
        if r.random() < 0.3:
            parts = parts[3:] + parts[:3]  # city first
    text = ("" if chinese else " ").join(parts)
    if r.random() < 0.3:  # one typo
        i = r.randrange(len(text))
        text = text[:i] + TYPOS.get(text[i], text[i].swapcase() or "x") + text[i + 1:]
    return text


def make_pairs(n: int, seed: int) -> list[tuple[str, str, float]]:
    r = random.Random(seed)
    pairs = []
    for i in range(n):
        make = chinese_address if i % 2 else english_address
        anchor = make(r)
        if r.random() < 0.5:
            pairs.append(("".join(anchor) if i % 2 else " ".join(anchor), rewrite(anchor, r), 1.0))
        else:
            other = make(r)
            pairs.append((rewrite(anchor, r), rewrite(other, r), 0.0))
    return pairs


def encode(text: str) -> torch.Tensor:
    """Hashed character bigrams (and unigrams), padded with 0: a tokenizer-free input."""
    grams = list(text) + [text[i:i + 2] for i in range(len(text) - 1)]
    ids = [1 + zlib.crc32(g.encode()) % (BUCKETS - 1) for g in grams][:LENGTH]
    return torch.tensor(ids + [0] * (LENGTH - len(ids)))


class AddressPairs(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.pairs = [(encode(a), encode(b), torch.tensor(y)) for a, b, y in make_pairs(n, seed)]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


class Matcher(torch.nn.Module):
    """Siamese: one encoder for both addresses, a learned scale on their cosine."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(BUCKETS, dim, mode="mean", padding_idx=0)
        self.project = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.Tanh(),
                                           torch.nn.Dropout(0.1), torch.nn.Linear(dim, dim))
        self.scale = torch.nn.Parameter(torch.tensor(5.0))
        self.bias = torch.nn.Parameter(torch.tensor(-2.0))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ea, eb = self.project(self.embed(a)), self.project(self.embed(b))
        return self.scale * torch.nn.functional.cosine_similarity(ea, eb) + self.bias


def accuracy(model: Matcher, data: AddressPairs) -> float:
    model.eval()
    with torch.no_grad():
        a, b, y = (torch.stack(t) for t in zip(*data.pairs, strict=True))
        correct = ((model(a, b) > 0).float() == y).float().mean().item()
    model.train()
    return correct


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-id", default=None, help="default: $BURST_RUN_ID")
    p.add_argument("--store", default=None, help="default: $BURST_STORE or ./.burst")
    p.add_argument("--save", default=None, help="write the trained model's state here")
    p.add_argument("--pairs", type=int, default=1536)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    train, test = AddressPairs(args.pairs, seed=1), AddressPairs(400, seed=2)
    model = Matcher()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * 24)

    run = burst.Run(args.run_id, store=args.store, global_batch=64,  # burst
                    micro_batch=args.micro_batch, shadow_every=2, persist_every=8)
    restored = run.attach(model, optimizer, scheduler)  # burst: restore-or-start
    if restored:
        print(f"resumed: {restored}", flush=True)
    sampler = burst.ResumableSampler(train, seed=0)  # burst: exact data position
    loader = DataLoader(train, batch_size=run.micro_batch, sampler=sampler)

    for _epoch in run.epochs(args.epochs):  # burst
        for step in run.steps(loader):  # burst: one optimizer step
            step_loss = 0.0
            for a, b, y in step:  # its micro-batches
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(a, b), y)
                (loss * step.weight(len(y))).backward()  # burst: mean over the step
                step_loss += loss.item() * step.weight(len(y))
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            run.log(loss=step_loss)  # burst: for `burst report`
    run.close()  # burst: final snapshot
    print(f"test accuracy {accuracy(model, test):.3f} after {run.step} steps", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
