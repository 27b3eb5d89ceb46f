"""The Hyperparameters tab's summary in plain words: the model, the time, the steps, what is checked.

Every number comes from core and nothing is computed here: for Auto, all of them come from one
core.plan.Plan (its model config, planned and maximum steps, passes, times); for a preset, your own
settings or a base model, from the form's configs through core.estimates and core.batches.stage_passes.
Each line is ``(heading, text)``; :func:`to_html` shows them with the heading in bold.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

from core.plan import AUTO, format_duration
from core.wording import count_words, memory_size

if TYPE_CHECKING:
    from core.config import ModelConfig, TrainConfig
    from core.dataset import Dataset
    from core.lora import LoRAConfig
    from core.plan import Plan

Line = tuple[str, str]


def _sizes(mc: ModelConfig, tc: TrainConfig, lora: LoRAConfig | None = None,
           base_types: dict[str, str] | None = None) -> str:
    """Device memory of training (with ``lora``: of the adapters on a base of ``base_types``, and of a full
    fine-tune beside it) and the GGUF file's size in each export type."""
    from core.estimates import gguf_size_bytes, training_memory_bytes

    batch = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
    mem = training_memory_bytes(mc, batch, tc.grad_accum, tc.freeze_embeddings, lora, base_types)
    full = (f"; a full fine-tune: {memory_size(training_memory_bytes(mc, batch, tc.grad_accum, tc.freeze_embeddings))}"
            if lora else "")
    files = ", ".join(f"{gguf_size_bytes(mc, d) / 1e6:.2f} MB ({d.upper()})" for d in ("f32", "f16", "q8_0"))
    return (f"training needs about {memory_size(mem)} of device memory (batch {batch}, context "
            f"{mc.context_length} tokens{full}); the {'merged ' if lora else ''}GGUF file is {files}")


def _lora_text(mc: ModelConfig, lora: LoRAConfig, base_types: dict[str, str] | None) -> str:
    """"LoRA adapters of rank 16 (alpha 32) on attn_q, …: 1,234 trained parameters; the base's block matrices
    stay in Q4_1 on the device" (core.lora.adapter_params, core.estimates.lora_base_plan)."""
    from core.estimates import lora_base_plan
    from core.lora import adapter_params

    kinds = sorted({qtype.name for _, qtype in lora_base_plan(mc, lora, base_types).values()})
    kept = f"; its block matrices stay in {', '.join(kinds)} on the device" if kinds else ""
    return (f"LoRA adapters of rank {lora.rank} (alpha {lora.alpha:g}) on {', '.join(lora.targets)}: "
            f"{adapter_params(mc, lora):,} trained parameters, the base frozen{kept}")


def _checked(tc: TrainConfig) -> str:
    """What the run checks, and when (the trainer's recall checks, core.trainer)."""
    written = " (and the questions written for facts)" if tc.fact_questions else ""
    if tc.check_every:
        sample = (f" ({tc.check_sample} of each kind, which show progress; all of them at the planned steps' end "
                  "and after, and only those end a stage)") if tc.check_sample else ""
        if tc.min_gain:
            give_up = f", or past its planned steps once a check gains less than {tc.min_gain:.0%} of the items"
        else:
            give_up = f", or after {count_words(tc.patience, 'check')} without progress" if tc.patience else ""
        text = (f"every {count_words(tc.check_every, 'step')}, which facts and dialogue answers{written} the model "
                "reproduces"
                f"{sample}; a stage ends once all are learned{give_up}.")
    else:
        text = (f"after each stage, which facts and dialogue answers{written} the model reproduces (the Training tab's "
                "table).")
    if tc.heldout:
        text += (f" {count_words(tc.heldout, 'fact question')} {'is' if tc.heldout == 1 else 'are'} kept out of training "
                 "to measure answers about facts no dialogue asks about.")
    return text


def _stages(steps: tuple[int, int], passes: tuple[float, float], seen: float = 0.0) -> str:
    """"N steps of pretraining on the facts (P passes), then M steps of tuning on the dialogues (Q passes)"."""
    parts = []
    if steps[0]:
        each = f"; each fact seen {seen:.0f} times" if seen else ""
        parts.append(f"{count_words(steps[0], 'step')} of pretraining on the facts "
                     f"({count_words(passes[0], 'pass', 'passes', 0)}{each})")
    if steps[1]:
        parts.append(f"{count_words(steps[1], 'step')} of tuning on the dialogues ({count_words(passes[1], 'pass', 'passes', 0)})")
    return ", then ".join(parts) or "no steps (both stages have 0 steps)"


def plan_lines(plan: Plan) -> list[Line]:
    """The Auto plan in plain words; every number is one of ``plan``'s."""
    mc, tc = plan.model_config, plan.train_config
    first = f" ({plan.first_run_note()})" if plan.first_run_note() else ""
    time = f"about {format_duration(plan.run_s)}{first}, recall checks included"
    if plan.expected_s < plan.total_s:
        time += (f"; at most {format_duration(plan.most_s)} for the planned steps (checks "
                 f"{format_duration(plan.check_s)}): a stage stops once everything is learned")
    else:
        time += f" ({format_duration(plan.check_s)} of checks)"
    if tc.time_budget_s:
        time += f". The run ends after {format_duration(tc.time_budget_s)} at the latest"
    training = _stages(plan.planned_steps, (plan.pretrain_passes, plan.tune_passes), plan.fact_exposures) + "."
    if (tc.pretrain.steps, tc.dialogues.steps) != plan.planned_steps:
        training += (f" A stage that has not learned by then goes on while recall improves, to at most "
                     f"{tc.pretrain.steps:,} + {tc.dialogues.steps:,} steps.")
    lines = [("Model", f"the {plan.preset} preset, {mc.n_params():,} parameters with the vocabulary of "
                       f"{mc.vocab_size:,} tokens your data needs; {_sizes(mc, tc)}."),
             ("Time", time + "."), ("Training", training), ("Checked", _checked(tc))]
    return lines + [("Note", note) for note in plan.notes]


def config_lines(mc: ModelConfig, tc: TrainConfig, name: str, passes: tuple[float, float],
                 base: str | None = None, lora: LoRAConfig | None = None,
                 base_types: dict[str, str] | None = None) -> list[Line]:
    """A run of the form's configs in plain words: ``name`` is the preset (or "Custom"); ``passes`` the
    stages' passes (core.batches.stage_passes); ``base`` the base model's name when it fine-tunes one,
    with ``lora`` adapters (None: every parameter) on a file of ``base_types``."""
    steps = (tc.pretrain.steps, tc.dialogues.steps)
    if base is not None:
        how = f"; {_lora_text(mc, lora, base_types)}" if lora else " (every parameter)"
        model = (f"fine-tunes {base}: {mc.n_params():,} parameters and the file's vocabulary of "
                 f"{mc.vocab_size:,} tokens{how}; {_sizes(mc, tc, lora, base_types)}.")
        time = ("timed when the run starts: before its first step, a few passes of the base model on this device "
                "give the Training tab its estimate and the process's resident memory at most.")
    else:
        what = "your settings" if name == "Custom" else f"the {name} preset"
        model = (f"{what}, at most {mc.n_params():,} parameters (with a full vocabulary of {mc.vocab_size:,} "
                 f"tokens; your data may need fewer); {_sizes(mc, tc)}.")
        time = "the Training tab shows it once the first steps are timed (Auto plans it before the run)."
    lrs = f" Learning rate {tc.pretrain.lr:g} and {tc.dialogues.lr:g}." if all(steps) else ""
    return [("Model", model), ("Time", time), ("Training", _stages(steps, passes) + "." + lrs),
            ("Checked", _checked(tc))]


def to_html(lines: list[Line]) -> str:
    """The lines as rich text, one paragraph each, the heading in bold."""
    return "<br>".join(f"<b>{html.escape(h)}:</b> {html.escape(t)}" for h, t in lines)


def to_text(lines: list[Line]) -> str:
    """The lines as plain text (tooltips, tests, the log)."""
    return "\n".join(f"{h}: {t}" for h, t in lines)


__all__ = ["plan_lines", "config_lines", "to_html", "to_text"]


def dataset_passes(tc: TrainConfig, dataset: Dataset) -> tuple[float, float]:
    """Passes over the facts and over the dialogues of the stages' steps, in the run's data mix
    (core.batches.stage_passes; 0 without such data)."""
    from core.batches import stage_passes

    questions = bool(tc.fact_questions and dataset.facts and dataset.dialogues)
    conversations = bool(tc.conversation_every and dataset.dialogues)
    return tuple(stage_passes(tc, i, st.steps, len(dataset.facts), len(dataset.dialogues), questions, conversations)
                 for i, st in enumerate((tc.pretrain, tc.dialogues)))


def form_lines(mc: ModelConfig, tc: TrainConfig, preset: str, plan: Plan | None, dataset: Dataset,
               base_name: str | None, no_plan: str, lora: LoRAConfig | None = None,
               base_types: dict[str, str] | None = None) -> list[Line]:
    """The plan in plain words for the Hyperparameters form's configs: the Auto plan's own numbers while
    the form shows it, else the configs' (a base model's, named ``base_name``, when one is chosen, taught
    through ``lora`` adapters on a file of ``base_types`` or in full); ``no_plan``: why Auto has no plan now
    ("" when it has one)."""
    if base_name is not None:
        return config_lines(mc, tc, preset, dataset_passes(tc, dataset), base_name, lora, base_types)
    if preset == AUTO and plan is not None:
        return plan_lines(plan)
    lines = config_lines(mc, tc, preset, dataset_passes(tc, dataset))
    return lines + ([("Note", no_plan)] if preset == AUTO and no_plan else [])
