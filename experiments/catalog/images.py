"""Experiments that need no code: any prepared image dataset, classified or
segmented by a model sized from the data.

    python -m experiments prepare images --source-dir photos/ --name flowers
    python -m experiments train image_classifier --dataset flowers
    python -m experiments train image_segmenter --dataset data/my_masks
"""

from experiments.catalog import models
from experiments.catalog.registry import register
from experiments.catalog.shapes import segmentation_metrics
from experiments.config.types import DataConfig, Experiment, ExperimentConfig, TrainConfig

CLASSIFIER = register(Experiment(
    config=ExperimentConfig(
        name="image_classifier",
        description="Conv blocks + global average pooling sized from the input (28x28 grey "
                    "to 224x224 RGB); any classification dataset: --dataset NAME_OR_DIR",
        data=DataConfig(dataset=None),
        train=TrainConfig(batch_size=64, max_steps=3000, eval_every_steps=500,
                          learning_rate=1e-3),
        model={"filters": 32, "blocks": 0, "dropout": 0.3, "num_classes": 0}),
    build_model=models.image_classifier))

SEGMENTER = register(Experiment(
    config=ExperimentConfig(
        name="image_segmenter",
        description="U-Net sized from the input and the mask's classes; any segmentation "
                    "dataset: --dataset NAME_OR_DIR",
        data=DataConfig(dataset=None, label="mask"),
        train=TrainConfig(batch_size=16, max_steps=3000, eval_every_steps=500,
                          learning_rate=2e-3),
        model={"filters": 16, "depth": 0, "num_classes": 0},
        best_metric="mean_iou"),
    build_model=models.unet,
    metrics=segmentation_metrics))
