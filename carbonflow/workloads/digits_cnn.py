"""A real, small training job: a PyTorch CNN on scikit-learn's bundled 8×8 digits (no download).

Runs alone or data-parallel under ``torch.distributed.run`` (gloo on CPU, NCCL on GPU). Reports
progress through :mod:`carbonflow.training`, stops early in profile mode, evaluates on a held-out
test split and saves the trained ``state_dict`` to ``$CARBONFLOW_OUTPUT_DIR/model.pt``.

    python -m carbonflow.workloads.digits_cnn --epochs 20 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from carbonflow import contract

SAMPLES_PER_EPOCH = 1437  # the 80 % train split of 1,797 digits (see _data); checked by a test


def _data(seed: int):  # type: ignore[no-untyped-def]
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype("float32") / 16.0
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    to_x = lambda a: torch.from_numpy(a).unsqueeze(1)  # noqa: E731
    to_y = lambda a: torch.from_numpy(a).long()  # noqa: E731
    return to_x(x_train), to_y(y_train), to_x(x_test), to_y(y_test)


def build_model():  # type: ignore[no-untyped-def]
    """Two conv blocks and a linear head for 1×8×8 inputs, 10 classes."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(64 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=contract.work_epochs(15))
    parser.add_argument("--batch-size", type=int, default=contract.work_batch_size(64))
    parser.add_argument("--lr", type=float, default=contract.learning_rate(0.002))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs <= 0 or args.batch_size <= 0:
        parser.error(f"--epochs={args.epochs} and --batch-size={args.batch_size} must be positive integers")

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from carbonflow import training

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    # One core per container (as a real allocation would give it); also avoids OpenMP spinning.
    torch.set_num_threads(contract.threads_per_container(1))
    torch.manual_seed(args.seed)
    if world_size > 1:
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")

    x_train, y_train, x_test, y_test = _data(args.seed)
    train_set = TensorDataset(x_train, y_train)
    sampler = (
        DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed) if world_size > 1 else None
    )
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler)

    model = build_model()
    if world_size > 1:
        model = DistributedDataParallel(model)
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr * training.lr_scale())
    loss_fn = torch.nn.CrossEntropyLoss()

    step = 0
    samples = 0
    stopped = False
    # A profile's budget is in steps (the wrapper stops it); it may need more than the job's epochs.
    epochs = 10**6 if training.profiling() else args.epochs
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            optimiser.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimiser.step()
            step += 1
            samples += len(xb) * world_size
            training.report(step, samples, loss=loss.item(), epoch=epoch)
            if _agreed_stop(training.should_stop(), world_size):
                stopped = True
                break
        if stopped:
            break

    result = {"steps": step, "samples": samples, "epochs_done": epoch + (0 if stopped else 1)}
    if not stopped and rank == 0:
        net = model.module if world_size > 1 else model
        net.eval()
        with torch.no_grad():
            accuracy = (net(x_test).argmax(dim=1) == y_test).float().mean().item()
        result["test_accuracy"] = accuracy
        out = training.output_dir()
        torch.save(net.state_dict(), out / "model.pt")
        (out / "metrics.json").write_text(json.dumps(result))
        training.report(step, samples, test_accuracy=accuracy)
    if world_size > 1:
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result))
    return 0


def _agreed_stop(local_stop: bool, world_size: int) -> bool:
    """Stop only when every rank stops at the same step (a lone rank leaving would hang the others' allreduce)."""
    if world_size == 1:
        return local_stop
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if local_stop else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if __name__ == "__main__":
    sys.exit(main())
