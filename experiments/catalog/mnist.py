"""MNIST: the dataset the seed question used, and the seed answer's CNN on it."""

from experiments.catalog import datasets, models
from experiments.catalog.registry import register, register_dataset
from experiments.config.types import DataConfig, Experiment, ExperimentConfig, TrainConfig

register_dataset("mnist",
                 "MNIST, 60k/10k 28x28 grey digits (IDX files from --source-dir or downloaded)",
                 datasets.idx_splits("mnist", [str(digit) for digit in range(10)]))

CNN = register(Experiment(
    config=ExperimentConfig(
        name="mnist_cnn",
        description="Seed CNN on MNIST (IDX files from --source-dir, or downloaded)",
        data=DataConfig(dataset="mnist"),
        train=TrainConfig(batch_size=128, max_steps=6000, eval_every_steps=2000),
        model={"filters": 32, "dense_units": 128, "conv_dropout": 0.25, "dropout": 0.5,
               "num_classes": 0}),
    build_model=models.seed_cnn))
