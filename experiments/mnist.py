"""MNIST: the seed answer's CNN on the dataset the seed question used."""

from experiments import models
from experiments.registry import DataConfig, Experiment, ExperimentConfig, TrainConfig, register

CNN = register(Experiment(
    config=ExperimentConfig(
        name="mnist_cnn",
        description="Seed CNN on MNIST (IDX files from --source-dir, or downloaded)",
        data=DataConfig(dataset="mnist"),
        train=TrainConfig(batch_size=128, max_steps=6000, eval_every_steps=2000),
        model={"filters": 32, "dense_units": 128, "conv_dropout": 0.25, "dropout": 0.5}),
    build_model=models.seed_cnn))
