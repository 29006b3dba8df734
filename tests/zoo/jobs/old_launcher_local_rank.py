"""Started with the old `python -m torch.distributed.launch`, which passes --local-rank=N on
the command line; the script's parser does not declare it (launch.local-rank-argument)."""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
print("epochs", args.epochs)
