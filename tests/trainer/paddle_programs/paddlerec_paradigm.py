"""PaddleRec's distributed training guide: its ten-line paradigm around a small
CTR-DNN (three id fields through one sparse table, an MLP), started as the guide
starts a 2x2 job: every process from Paddle's environment variables
(PADDLE_PSERVERS_IP_PORT_LIST, TRAINING_ROLE, POD_IP, PADDLE_PORT,
PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID), no launcher.

Run: python paddlerec_paradigm.py DATA_DIR OUT_DIR
Each worker writes OUT_DIR/worker{i}.json: records and mean loss per pass, the
table's rows as the servers count them, its dense parameters, and (worker 0)
the held-out AUC.
"""

import json
import os
import sys

import torch
import torch.nn as nn

import trainer.job.role_maker as role_maker
from datafeed import InMemoryDataset, Slot
from trainer import Executor, StreamingAUC, fleet
from trainer.fleet import StrategyFactory
from trainer.nn import SparseEmbedding

READER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paddlerec_reader.py")
FIELDS = ["user", "item", "category"]
SLOTS = [Slot(name, "uint64") for name in FIELDS] + [Slot("label", "int64", (1,))]


class CtrDnn(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.embedding = SparseEmbedding(dim, "SparseFeatFactors")
        self.mlp = nn.Sequential(nn.Linear(3 * dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch):
        x = torch.cat([self.embedding(batch[name]) for name in FIELDS], dim=1)
        logit = self.mlp(x).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


def dataset_of(files):
    dataset = InMemoryDataset()
    dataset.init(batch_size=32, thread_num=1, use_var=SLOTS,
                 pipe_command=f"{sys.executable} {READER}")
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def main():
    data_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = CtrDnn()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)

    # The paradigm, line by line.
    role = role_maker.PaddleCloudRoleMaker()
    fleet.init(role)
    strategy = StrategyFactory.create_sync_strategy()
    optimizer = fleet.distributed_optimizer(optimizer, strategy)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
    if fleet.is_worker():
        fleet.init_worker()
        result = train(model, optimizer, data_dir)
        with open(os.path.join(out_dir, f"worker{fleet.worker_index()}.json"), "w") as f:
            json.dump(result, f)
        fleet.stop_worker()


def train(model, optimizer, data_dir):
    files = sorted(os.path.join(data_dir, name) for name in os.listdir(data_dir))
    train_set = dataset_of(fleet.util.get_file_shard(files[:-1]))
    executor = Executor()
    passes = []
    for pass_id in range(2):
        train_set.local_shuffle(seed=pass_id)
        summary = executor.train_from_dataset(model, train_set, optimizer, thread=1,
                                              fetch_list=[])
        passes.append({"records": summary.records, "mean_loss": summary.mean_loss})
    fleet.barrier_worker()
    result = {
        "passes": passes,
        "rows": fleet.table_stats()["SparseFeatFactors"]["rows"],
        "dense": [p.detach().reshape(-1).tolist() for p in model.mlp.parameters()],
    }
    if fleet.is_first_worker():
        metric = StreamingAUC()
        executor.infer_from_dataset(
            model, dataset_of(files[-1:]), fetch_list=[],
            fetch_handler=lambda out: metric.update(out["label"], out["prob"]),
        )
        result["auc"] = metric.compute()
    return result


if __name__ == "__main__":
    main()
