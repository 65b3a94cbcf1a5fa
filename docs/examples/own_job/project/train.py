"""A small PyTorch training that is not carbonflow's: it reads its work from the command line, reports
progress to carbonflow, and saves its model where carbonflow registers it."""

import argparse
import os
import time

import torch

from carbonflow import training

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--batch-size", type=int, required=True)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(512, 16)
y = (x[:, 0] > 0).long()
model = torch.nn.Linear(16, 2)
optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for _epoch in range(args.epochs):
    for i in range(0, len(x), args.batch_size):
        loss = torch.nn.functional.cross_entropy(model(x[i : i + args.batch_size]), y[i : i + args.batch_size])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        step += 1
        time.sleep(0.01)  # a real step takes time; this one would be too quick to see
        training.report(step, step * args.batch_size, loss=loss.item())
        if training.should_stop():  # profiling has measured enough
            break
    if training.should_stop():
        break
accuracy = (model(x).argmax(1) == y).float().mean().item()
training.report(step, step * args.batch_size, test_accuracy=accuracy)
os.makedirs(os.environ["CARBONFLOW_OUTPUT_DIR"], exist_ok=True)
torch.save(model.state_dict(), os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "model.pt"))
