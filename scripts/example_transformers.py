"""A Hugging Face Trainer fine-tuning a (tiny) GPT-2 with burst: the model, the data and
the TrainingArguments are a plain Trainer script's; the lines marked ``# burst`` are the
change. Run it again after a crash and it continues at the exact sample.

tests/training/test_transformers_trainer.py kills it (``BURST_FAULT``, ``BURST_KILLPOINT``)
and checks the resumed run against an uninterrupted one; docs/transformers.md walks
through it. ``--lora`` trains LoRA adapters through TRL's SFTTrainer instead."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import burst
from burst.integrations.transformers import BurstTrainer, burst_trainer  # burst

VOCAB, CONTEXT = 96, 16


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences (a real script tokenises its corpus)."""

    def __init__(self, count: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (count, CONTEXT), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        ids = self.ids[index]
        return {"input_ids": ids, "labels": ids.clone(), "index": torch.tensor(int(index))}


def tiny_gpt2(width: int = 32) -> GPT2LMHeadModel:
    """GPT-2's architecture at toy size, built from a config (nothing downloaded)."""
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=width, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return GPT2LMHeadModel(config)


class Recording:
    """Test bookkeeping: which samples each optimizer step trained on, and its loss."""

    records: str | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        index = inputs.pop("index", None)  # TRL's collator keeps only the model's inputs
        if self.records and index is not None:
            with open(self.records, "a") as out:
                out.write(json.dumps({"step": self.state.global_step + 1, "pid": os.getpid(),
                                      "time": time.time(), "indices": index.tolist()}) + "\n")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def lora_trainer(args: TrainingArguments, run: burst.Run, data: Tokens, width: int):
    """TRL's SFTTrainer with LoRA adapters on the attention projections."""
    import datasets
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    rows = datasets.Dataset.from_dict({"input_ids": data.ids.tolist(),
                                       "index": list(range(len(data)))})
    config = SFTConfig(**{f.name: getattr(args, f.name) for f in args.__dataclass_fields__.values()
                          if f.init}, max_length=CONTEXT, dataset_text_field=None,
                       completion_only_loss=False, packing=False)
    trainer_class = type("RecordingSFT", (Recording, burst_trainer(SFTTrainer)), {})  # burst
    return trainer_class(run=run, model=tiny_gpt2(width), args=config, train_dataset=rows,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                lora_dropout=0.1),
                         processing_class=_tokenizer())


def _tokenizer():
    """A word-level tokenizer over the toy vocabulary, built in memory (no download)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<pad>": VOCAB - 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "<pad>")),
                                   pad_token="<pad>", eos_token="<pad>")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", default=None)
    p.add_argument("--store", default=None)
    p.add_argument("--out", default="trainer-out")
    p.add_argument("--records", default=None)
    p.add_argument("--final", default=None)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--persist-every", type=int, default=None)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--report-to", nargs="*", default=[])
    p.add_argument("--lora", action="store_true")
    p.add_argument("--width", type=int, default=32, help="GPT-2's n_embd")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    run = burst.Run(args.run_id, store=args.store, global_batch=8, micro_batch=4,  # burst
                    persist_every=args.persist_every, keep=args.keep,
                    shadow_every=1 if args.persist_every else None)
    training = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_train_epochs=args.epochs, learning_rate=3e-3, warmup_steps=2, weight_decay=0.01,
        lr_scheduler_type="cosine", logging_steps=1, save_strategy="no", seed=7,
        report_to=args.report_to, remove_unused_columns=False, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    data = Tokens(args.samples)
    if args.lora:
        trainer = lora_trainer(training, run, data, args.width)
    else:
        trainer_class = type("RecordingTrainer", (Recording, BurstTrainer), {})
        trainer = trainer_class(run=run, model=tiny_gpt2(args.width), args=training,  # burst: run=run
                                train_dataset=data)
    trainer.records = args.records
    trainer.train()
    if args.final:
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        torch.save({"model": {k: v for k, v in trainer.model.state_dict().items()},
                    "losses": losses, "step": trainer.state.global_step,
                    "rng": torch.get_rng_state()}, args.final)
    if os.environ.get("BURST_EXAMPLE_PRINT"):
        print(json.dumps(trainer.state.log_history[-1]))


if __name__ == "__main__":
    main()
