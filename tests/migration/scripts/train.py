"""A MosaicML training script as its docs write one (StreamingDataset, torch DataLoader, a step).

``python train.py CONFIG OUT``: CONFIG (JSON, as a config file would hold them) gives the
streams, the dataset's keywords, the DataLoader's batch size and workers and the epochs;
OUT receives the ``id`` of every sample each epoch trained on, and ``len(dataset)``. The
tests run it with only its imports changed (``run_example.to_astream``), one process per
rank, as torchrun would start it.
"""

import json
import sys

import torch
from streaming import Stream, StreamingDataset
from torch.utils.data import DataLoader


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    streams = [Stream(**stream) for stream in config["streams"]]
    dataset = StreamingDataset(streams=streams, **config["dataset"])
    loader = DataLoader(dataset, batch_size=config["batch_size"], num_workers=config["num_workers"])

    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    epochs = []
    for _ in range(config["epochs"]):
        seen = []
        for batch in loader:
            ids = batch["id"]
            loss = model(torch.as_tensor(ids, dtype=torch.float32).reshape(-1, 1)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.extend(int(i) for i in ids)
        epochs.append(seen)
    with open(sys.argv[2], "w") as f:
        json.dump({"epochs": epochs, "len": len(dataset)}, f)


if __name__ == "__main__":
    main()
