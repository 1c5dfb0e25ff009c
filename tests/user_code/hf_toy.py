# A user's Hugging Face Trainer script: a tiny GPT-2 built from a config (no download), the usual
# resume from output_dir. With --slurmkit it adds slurmkit's agreed stop (the lines marked
# `# slurmkit: N`, docs/frameworks.md). Each step prints `rank=R step=N ` once it ends.
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        self.data = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


class PrintSteps(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"rank={args.process_index} step={state.global_step} ", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--out", required=True)
    parser.add_argument("--slurmkit", action="store_true")
    args = parser.parse_args()
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                                 save_steps=args.save_steps, logging_steps=10, report_to=[], use_cpu=True,
                                 dataloader_num_workers=0, seed=0, disable_tqdm=True)
    callbacks = [PrintSteps()]
    if args.slurmkit:
        from slurmkit.huggingface import AgreedStopCallback  # slurmkit: 1

        callbacks.append(AgreedStopCallback())  # slurmkit: 2
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=Tokens(4096, 32, 128),
                      callbacks=callbacks)
    last = get_last_checkpoint(args.out) if os.path.isdir(args.out) else None  # as HF's examples resume
    trainer.train(resume_from_checkpoint=last)
    print(f"rank={training.process_index} done global_step={trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
