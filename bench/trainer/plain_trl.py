"""The peer: a plain TRL 1.16 script, written as TRL's docs and example scripts
(``trl/scripts/{dpo,grpo,reward}.py``) set these trainers up for LoRA: the model by path with
``model_init_kwargs`` (its dtype), a PEFT ``LoraConfig``, the trainer's own config class.

Same model folder, rows, lengths, batch, steps, LoRA r/alpha/dropout/targets, learning rate,
beta and seed as Flywheel's side. On a GPU: bf16 weights and bf16 mixed precision, gradient
checkpointing on (TRL's defaults for both), nothing else changed. On the CPU it runs as
Flywheel does there: float32, no gradient checkpointing (TRL would default to bf16 autocast
on the CPU too, which is slower there and would not be the same settings). Saving is off
(``save_strategy="no"``; Flywheel's one save comes after the timed steps) and every step is
logged (``logging_steps=1``), as on Flywheel's side, because the step times come from the
logs."""

from __future__ import annotations

from typing import Any

import data


def train(kind: str, p: dict[str, Any], model_dir: str, out_dir: str, callbacks: list[Any]) -> Any:
    """Build and run the TRL trainer for ``kind``; returns it after training."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    cuda = p["device"].startswith("cuda")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(data.rows(kind, p, tokenizer))
    common = {
        "output_dir": out_dir,
        "max_steps": p["warmup_steps"] + p["measured_steps"],
        "learning_rate": p["learning_rate"],
        "per_device_train_batch_size": p["batch_size"],
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": p["seed"],
        "model_init_kwargs": {"dtype": torch.bfloat16 if cuda else torch.float32},
        **(
            {"bf16": True, "gradient_checkpointing": True}
            if cuda
            else {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}
        ),
    }
    lora = {
        "r": p["lora_r"],
        "lora_alpha": p["lora_alpha"],
        "lora_dropout": p["lora_dropout"],
        "target_modules": list(p["lora_targets"]),
    }

    if kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, max_length=data.max_length(p), beta=p["dpo_beta"])
        trainer = DPOTrainer(
            model=model_dir,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=LoraConfig(task_type="CAUSAL_LM", **lora),
            callbacks=callbacks,
        )
    elif kind == "reward_model":
        from trl import RewardConfig, RewardTrainer

        args = RewardConfig(**common, max_length=data.max_length(p))
        trainer = RewardTrainer(
            model=model_dir,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            # TRL's advice for a causal LM turned reward model: train the new score head in full.
            peft_config=LoraConfig(task_type="SEQ_CLS", modules_to_save=["score"], **lora),
            callbacks=callbacks,
        )
    elif kind == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        # GRPO's batch counts completions: batch_size prompts x num_generations.
        common["per_device_train_batch_size"] = data.samples_per_step(kind, p)
        args = GRPOConfig(
            **common,
            num_generations=p["num_generations"],
            max_completion_length=p["completion_length"],
            temperature=p["temperature"],
            beta=p["grpo_beta"],
        )
        trainer = GRPOTrainer(
            model=model_dir,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            reward_funcs=[data.reward],
            peft_config=LoraConfig(task_type="CAUSAL_LM", **lora),
            callbacks=callbacks,
        )
    else:
        raise ValueError(f"kind {kind!r}: not dpo, grpo or reward_model")
    trainer.train()
    return trainer
