"""Hugging Face ``transformers.Trainer`` (and TRL's trainers, PEFT models) with burst:
snapshots, the exact data position and failover, with the training script's model, data
and arguments unchanged::

    run = burst.Run("gpt2-ft", global_batch=32, micro_batch=8)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                             gradient_accumulation_steps=4, num_train_epochs=3,
                             save_strategy="no", report_to=["tensorboard"])
    trainer = BurstTrainer(run=run, model=model, args=args, train_dataset=data)
    trainer.train()              # run it again after a crash: it continues exactly

    SFT = burst_trainer(trl.SFTTrainer)   # any Trainer subclass gets the same treatment

What the Trainer cannot do and this does:

- **Resume without a skipping loop.** The Trainer resumes a half-finished epoch by
  iterating its loader past the consumed batches (hours on a large epoch). Here the
  loader's sampler is burst's ``ResumableSampler``, which starts at the next unconsumed
  sample: resuming late in an epoch costs what resuming early does.
- **Exact state.** Model (a PEFT model's adapters and frozen base alike), optimizer,
  scheduler, GradScaler, every RNG, the Trainer's counters and its pending loss
  accumulator come back bitwise; the logged losses equal an uninterrupted run's.
- **The re-plan.** ``burst resume`` may run the run on another card with another
  micro-batch, accumulation and precision (``BURST_MICRO_BATCH``, ``BURST_AMP``): they
  are applied to ``per_device_train_batch_size``, ``gradient_accumulation_steps`` and
  ``bf16``/``fp16`` here, with the global batch, and the samples of every optimizer step,
  kept. The arguments must describe the run's global batch (micro x accumulation x
  processes); a precision set in the arguments becomes the run's.
- **Trackers that continue.** ``report_to`` TensorBoard, W&B and MLflow go through
  ``run.trackers`` (:mod:`burst.training.trackers`): the same run, no duplicated or
  missing step after a resume.

The Trainer's own checkpoints (``save_strategy``) still work and may stay (for
evaluation, for ``load_best_model_at_end``), but burst's snapshots do the resume: the
newest snapshot wins, always, and ``train(resume_from_checkpoint=...)`` is refused.

Where the callback API cannot reach (the sampler, the restored counters, the epoch's
remaining length, the step boundary after logging), the mixin overrides the Trainer's
loop methods of transformers 5 (``_get_train_sampler``, ``_init_training_state``,
``_run_epoch``, ``_maybe_log_save_evaluate``); a Trainer without them is refused at
start. One process only for now (no DDP, FSDP or DeepSpeed through the Trainer).

Randomness while loading must not draw from the global generators: the Trainer's loader
fetches a batch ahead (wrap the dataset in ``burst.SeededDataset`` for augmentation; a
collator that draws random numbers, such as masked-LM masking, is not replayed exactly).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sized
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback
from transformers.integrations.integration_utils import default_logdir, rewrite_logs

from burst.contract import ENV_AMP
from burst.errors import ConfigError
from burst.integrations.loop import ForeignLoop
from burst.state import rng
from burst.training import failure
from burst.training.run import Run
from burst.training.sampler import ResumableSampler

STATE_KEY = "burst.trainer"  # the Trainer's own counters in a snapshot's extra state
_LOOP_METHODS = ("_get_train_sampler", "_init_training_state", "_run_epoch",
                 "_maybe_log_save_evaluate")
_TRACKED = (TensorBoardCallback, WandbCallback, MLflowCallback)

if TYPE_CHECKING:  # the mixin is only ever put before a Trainer class: it sees the Trainer
    _TrainerBase = Trainer
else:
    _TrainerBase = object


def plan_arguments(args: TrainingArguments, run: Run) -> TrainingArguments:
    """``args`` with the run's plan applied: its micro-batch, accumulation and precision.

    The arguments must describe the run's global batch; the plan (the run's layout,
    re-planned for this card by ``burst resume``) then replaces micro-batch and
    accumulation, so every optimizer step still sees the same samples."""
    if args.world_size != 1 or run.world_size != 1:
        raise ConfigError("the burst Trainer adapter runs one process for now "
                          f"(the arguments have {args.world_size}, the run {run.world_size})")
    planned = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if planned != run.global_batch:
        raise ConfigError(
            f"TrainingArguments give a global batch of {planned} "
            f"(per_device_train_batch_size={args.per_device_train_batch_size} x "
            f"gradient_accumulation_steps={args.gradient_accumulation_steps}), the run "
            f"{run.global_batch}: make them agree")
    given = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    if ENV_AMP not in os.environ and given is not None and run.amp not in (None, given):
        raise ConfigError(f"TrainingArguments ask for {given}, the run for {run.amp}: "
                          "make them agree")
    if ENV_AMP not in os.environ and run.amp is None:
        run.amp = given  # the script's precision is the run's (recorded in snapshots)
    return dataclasses.replace(args, per_device_train_batch_size=run.micro_batch,
                               gradient_accumulation_steps=run.accumulation,
                               bf16=run.amp == "bf16", fp16=run.amp == "fp16")


class BurstCallback(TrainerCallback):
    """Keeps the run in step with a Trainer made by :class:`BurstTrainerMixin`: step
    boundaries and micro-batches (for ``BURST_FAULT`` drills and the OOM fallback), the
    Trainer's restored loss accumulator, the trackers, the final snapshot."""

    def __init__(self, run: Run, trainer: BurstTrainerMixin) -> None:
        self.run = run
        self.trainer = trainer
        self.micro = 0
        self.step_done = False  # an optimizer step ended; burst counts it after logging
        self.deferred = False  # the epoch's last step: counted after the epoch's own work

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any,
                       **kwargs: Any) -> None:
        saved = self.run.extra.pop(STATE_KEY, None)
        if saved is not None:
            _restore_trainer(self.trainer, saved)

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any,
                      **kwargs: Any) -> None:
        self.micro = 0
        self.run.begin_step()
        self.run.before_micro_batch(0)

    def on_substep_end(self, args: TrainingArguments, state: Any, control: Any,
                       **kwargs: Any) -> None:
        self.micro += 1
        self.run.before_micro_batch(self.micro)

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any,
                    **kwargs: Any) -> None:
        # the Trainer counts the epoch's fraction from the start of this process's part of
        # it; the run knows the position in the whole epoch
        run, length = self.run, self.trainer.burst_loop.adopted().epoch_length()
        state.epoch = run.epoch + (run.samples_in_epoch + self.step_samples()) / length
        self.step_done = True

    def on_log(self, args: TrainingArguments, state: Any, control: Any,
               logs: dict | None = None, **kwargs: Any) -> None:
        if logs and self.run.trackers:
            self.run.trackers.log(rewrite_logs(logs), step=state.global_step)

    def on_train_end(self, args: TrainingArguments, state: Any, control: Any,
                     **kwargs: Any) -> None:
        self.run.extra[STATE_KEY] = _trainer_state(self.trainer)
        self.run.close()

    def step_samples(self) -> int:
        """Samples of the step in progress: a global batch, or the epoch's short tail."""
        length = self.trainer.burst_loop.adopted().epoch_length()
        return min(self.run.global_batch, length - self.run.samples_in_epoch)

    def after_log_save_evaluate(self) -> None:
        """The Trainer finished a step's logging, evaluation and saving (or the epoch's):
        count the step now, so a snapshot holds what the step logged. The epoch's last
        step waits for the epoch's own work (an evaluation draws random numbers)."""
        if self.step_done:
            self.step_done = False
            samples = self.step_samples()
            ends_epoch = self.run.samples_in_epoch + samples >= \
                self.trainer.burst_loop.adopted().epoch_length()
            if ends_epoch and not self.trainer.control.should_training_stop:
                self.deferred = True
                return
            self._end_step(samples)
        elif self.deferred:
            self.deferred = False
            self._end_step(self.step_samples())

    def _end_step(self, samples: int) -> None:
        self.run.extra[STATE_KEY] = _trainer_state(self.trainer)
        self.run.end_step(samples)


class BurstTrainerMixin(_TrainerBase):
    """Put before a ``Trainer`` class (``class T(BurstTrainerMixin, SFTTrainer)``, or
    :func:`burst_trainer`): the run's plan, sampler, restore and step boundaries."""

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        missing = [m for m in _LOOP_METHODS if not hasattr(Trainer, m)]
        if missing:
            import transformers

            raise ConfigError(f"transformers {transformers.__version__} has no Trainer."
                              f"{missing[0]}: burst's Trainer adapter needs transformers 5.3 or newer")
        if len(args) > 1:  # Trainer(model, args, ...)
            args = (args[0], plan_arguments(args[1], run), *args[2:])
        elif kwargs.get("args") is not None:
            kwargs["args"] = plan_arguments(kwargs["args"], run)
        else:
            raise ConfigError("pass the TrainingArguments (args=...): they hold the batch "
                              "layout burst plans")
        super().__init__(*args, **kwargs)
        if self.args.train_sampling_strategy != "random":
            raise ConfigError(f"train_sampling_strategy={self.args.train_sampling_strategy!r}: "
                              "burst orders the data itself (ResumableSampler); use 'random'")
        self.burst_run = run
        self.burst_loop = ForeignLoop(run)
        self.burst_callback = BurstCallback(run, self)
        self._burst_trackers = _take_tracker_callbacks(self)
        self._burst_sampler: ResumableSampler | None = None
        self._burst_rng: dict | None = None
        self.add_callback(self.burst_callback)

    # -- the data order -------------------------------------------------------------------

    def _get_train_sampler(self, train_dataset: Any = None) -> ResumableSampler:
        # the Trainer asks for a sampler only once it holds a training set with a length
        dataset = cast(Sized, train_dataset if train_dataset is not None else self.train_dataset)
        sampler = self._burst_sampler
        if sampler is None or sampler.num_samples != len(dataset):
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            sampler = ResumableSampler(dataset, seed=seed, drop_last=self.args.dataloader_drop_last)
            self._burst_sampler = sampler
            self.burst_loop.use_sampler(sampler)
        sampler.set_epoch(self.burst_run.epoch)  # whole epochs while the Trainer sizes them
        return sampler

    # -- restore-or-start -----------------------------------------------------------------

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint:
            raise ConfigError("burst resumes from its own snapshots: drop "
                              "resume_from_checkpoint (Trainer checkpoints may stay, for "
                              "evaluation)")
        try:
            return super().train(None, *args, **kwargs)
        except BaseException as exc:
            if failure.classify(exc) is not None:  # CUDA OOM, a lost GPU: burst's exit
                raise SystemExit(self.burst_run.recover(exc)) from None
            raise

    def _init_training_state(self, max_steps: int, num_update_steps_per_epoch: int,
                             num_train_epochs: int, resume_from_checkpoint: Any,
                             trial: Any) -> tuple[int, int]:
        """Restore burst's newest snapshot where the Trainer would read its checkpoint,
        so its counters, the scheduler's length and the epochs left all follow it."""
        super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                     None, trial)
        run = self.burst_run
        self.create_optimizer()  # now rather than in the preparation, to restore them
        self.create_scheduler(num_training_steps=max_steps, optimizer=self.optimizer)
        self._created_lr_scheduler = False  # so the preparation keeps the restored one
        scaler = getattr(self.accelerator, "scaler", None)
        model = cast(torch.nn.Module, self.model)  # the Trainer refuses to start without one
        report = run.attach(model, self.optimizer, self.lr_scheduler, scaler,
                            sampler=self._burst_sampler)
        run.total_epochs, run.steps_per_epoch = num_train_epochs, num_update_steps_per_epoch
        if report is not None:
            self.burst_loop.roll_over_finished_epoch()
            self._burst_rng = rng.capture()  # put back right before the first batch
        self.state.global_step = run.step
        length = self.burst_loop.adopted().epoch_length()
        self.state.epoch = run.epoch + run.samples_in_epoch / length
        _add_trackers(self, self._burst_trackers)
        return run.epoch, 0

    # -- the loop -------------------------------------------------------------------------

    # the Trainer calls it with keywords only, which lets this take them as one dict
    def _run_epoch(self, **kwargs: Any) -> None:  # type: ignore[override]
        """One epoch from the next unconsumed sample: the loader starts there, and the
        Trainer is told how many batches and optimizer steps are left of it."""
        run, loop = self.burst_run, self.burst_loop
        if kwargs["epoch"] != run.epoch:
            raise ConfigError(f"the Trainer runs epoch {kwargs['epoch']}, the run is in "
                              f"epoch {run.epoch}")
        with loop.held_position(kwargs["train_dataloader"]):
            remaining = loop.adopted().remaining()
            micro = self.args.per_device_train_batch_size
            batches = remaining // micro if self.args.dataloader_drop_last \
                else math.ceil(remaining / micro)
            kwargs["steps_in_epoch"] = batches
            kwargs["num_update_steps_per_epoch"] = math.ceil(
                batches / self.args.gradient_accumulation_steps)
            if self._burst_rng is not None:
                rng.restore(self._burst_rng)
                self._burst_rng = None
            super()._run_epoch(**kwargs)
        if run.samples_in_epoch >= loop.adopted().epoch_length():
            loop.end_epoch()
        else:
            run.abandon_step()

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        super()._maybe_log_save_evaluate(*args, **kwargs)
        self.burst_callback.after_log_save_evaluate()


class BurstTrainer(BurstTrainerMixin, Trainer):
    """``transformers.Trainer`` with burst: ``BurstTrainer(run=run, model=..., args=...)``."""


def burst_trainer(trainer_class: type) -> type:
    """The burst version of any ``Trainer`` subclass (TRL's ``SFTTrainer``, your own)."""
    if not issubclass(trainer_class, Trainer):
        raise ConfigError(f"{trainer_class.__name__} is not a transformers.Trainer")
    return type(f"Burst{trainer_class.__name__}", (BurstTrainerMixin, trainer_class), {})


def _trainer_state(trainer: Trainer) -> dict[str, Any]:
    """What the Trainer keeps between steps that a resume must give back: its counters,
    its log so far, and the loss it sums up until the next logging step."""
    state = trainer.state
    return {"log_history": state.log_history, "total_flos": state.total_flos,
            "num_input_tokens_seen": state.num_input_tokens_seen,
            "best_metric": state.best_metric, "best_global_step": state.best_global_step,
            "best_model_checkpoint": state.best_model_checkpoint,
            "tr_loss": trainer._tr_loss,
            "globalstep_last_logged": trainer._globalstep_last_logged,
            "current_flos": trainer.current_flos}


def _restore_trainer(trainer: Trainer, saved: dict[str, Any]) -> None:
    state = trainer.state
    state.log_history = list(saved.get("log_history") or [])
    for key in ("total_flos", "num_input_tokens_seen", "best_metric", "best_global_step",
                "best_model_checkpoint"):
        if key in saved:
            setattr(state, key, saved[key])
    loss = saved.get("tr_loss")
    if loss is not None:
        trainer._tr_loss = loss.to(trainer._tr_loss.device)
        # the Trainer reports train_loss over this train() call's steps, as after its own
        # resume: the pending sum's part from before the resume is taken out again
        trainer._total_loss_scalar = -float(loss)
    trainer._globalstep_last_logged = int(saved.get("globalstep_last_logged") or state.global_step)
    # its `= 0` declares an int, but the Trainer itself adds floats to it
    trainer.current_flos = float(saved.get("current_flos") or 0.0)  # type: ignore[assignment]


def _take_tracker_callbacks(trainer: Trainer) -> list[type]:
    """Take the ``report_to`` trackers burst continues off the Trainer: they log through
    ``run.trackers`` instead, opened once the snapshot says where the run stands."""
    taken = []
    for callback in list(trainer.callback_handler.callbacks):
        if isinstance(callback, _TRACKED):
            trainer.remove_callback(callback)
            taken.append(type(callback))
    return taken


def _add_trackers(trainer: BurstTrainerMixin, kinds: list[type]) -> None:
    args, trackers = trainer.args, trainer.burst_run.trackers
    for kind in kinds:
        if issubclass(kind, TensorBoardCallback) and "tensorboard" not in trackers:
            log_dir = os.getenv("TENSORBOARD_LOGGING_DIR") or \
                os.path.join(cast(str, args.output_dir), default_logdir())  # set by its __post_init__
            trackers.tensorboard(os.path.expanduser(log_dir))
        elif issubclass(kind, WandbCallback) and "wandb" not in trackers:
            trackers.wandb(project=os.getenv("WANDB_PROJECT", "huggingface"),
                           name=args.run_name, dir=os.getenv("WANDB_DIR"),
                           config=args.to_dict())
        elif issubclass(kind, MLflowCallback) and "mlflow" not in trackers:
            trackers.mlflow(os.getenv("MLFLOW_TRACKING_URI"),
                            os.getenv("MLFLOW_EXPERIMENT_NAME"), args.run_name)
