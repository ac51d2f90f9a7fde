"""A user's own data and code, end to end through the CLI (issue 13).

Real Fashion-MNIST images as the user's image files, ImageNet-style TFRecord
files and a segmentation folder go through ``prepare`` and train
``image_classifier`` / ``image_segmenter`` past a real baseline; the export
is loaded and used by a Python that never imports this package. Config files,
``show`` and ``MODEL_DIR/config.yaml`` are checked on real runs, and the
docs' example module and prediction snippet (docs/tutorials/) are run as they are written.
The commands are the docs' own (tests/test_docs.py checks it), and what they
print is compared with the outputs the docs show (docs_pages.assert_shows).

Sizes are chosen so that each claim is real and the file stays within a few
minutes of CPU: 300 images per class at 28x28, a few hundred steps.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from docs_pages import assert_shows, readme_block
from support import FASHION, ROOT, child_env, latest_step

if os.path.isdir(FASHION):
    import user_data  # its makers read Fashion-MNIST
else:
    user_data = None

OUR_PACKAGES = ("estimator_keras", "experiments")
# Fast enough for a test, and well past chance on every dataset below.
CLASSIFIER = ("--hparams", "filters=16,learning_rate=0.003")


def needs_fashion():
    if user_data is None:
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")


def cli(*args, cwd=ROOT, env=None, timeout=300, merged=False):
    """``python -m experiments ARGS`` run in ``cwd``: (returncode, stdout,
    stderr); ``merged``: stderr in stdout, as a terminal shows them, and ""."""
    env = env or child_env()
    env.pop("ESTIMATOR_KERAS_DATA_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)],
                          cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr or ""


def ok(result):
    rc, out, err = result
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    return out, err


def plain_python(code, *args, cwd, timeout=180):
    """Runs ``code`` in an isolated interpreter (``-I``: no PYTHONPATH, no
    current directory on the path), as a plain Keras user would; the code
    prints JSON, returned parsed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-I", "-c", code, *map(str, args)], cwd=str(cwd),
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def manifest(data_dir, name):
    return load_json(os.path.join(str(data_dir), name, "dataset.json"))


def split_sizes(found):
    return {split: info["num_examples"] for split, info in found["splits"].items()}


# ---------------------------------------------------------------------------
# 1. A folder of the user's own images


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """``prepare images`` on 300 real Fashion-MNIST images per class (one in
    seven a 36x36 colour JPEG, the rest 28x28 grey PNG) plus a truncated PNG and
    a text file, run from a user's project folder with the default paths
    (``data/``, ``runs/NAME``)."""
    needs_fashion()
    root = tmp_path_factory.mktemp("project")
    # The maker interleaves classes: an interval that divides 10 (such as 5)
    # would make whole classes JPEG, a shortcut the model learns instead of
    # garments. 7 spreads about 43 JPEGs over every class.
    folder = user_data.make_image_folder(root / "photos", per_class=300, jpeg_every=7,
                                         jpeg_size=(36, 36))
    jpegs = {os.path.dirname(p) for p, _, _ in folder.files if p.endswith(".jpg")}
    assert len(jpegs) == 10, jpegs
    out, _ = ok(cli("prepare", "images", "--source-dir", "photos", "--name", "photos",
                    cwd=root, merged=True))
    return {"root": root, "folder": folder, "out": out}


@pytest.fixture(scope="module")
def photos_model(photos):
    """``train image_classifier --dataset photos``, the docs' command, for
    200 steps."""
    root = photos["root"]
    out, _ = ok(cli("train", "image_classifier", "--dataset", "photos", "--max-steps", 200,
                    "--eval-every", 100, cwd=root, merged=True))
    return {"export": root / "runs" / "image_classifier" / "export", "out": out}


@pytest.fixture(scope="module")
def held_out(photos):
    """The user's own new images, not in the folder trained on: the first 10
    of each class of Fashion-MNIST's test split, as files (every third a
    40x40 colour JPEG, the others 28x28 grey PNG) -> {path: class name}."""
    images, labels = user_data.fashion_examples(10, split="test")
    files = {}
    for k, (image, label) in enumerate(zip(images, labels)):
        name = user_data.FASHION_CLASSES[label]
        if k % 3 == 2:
            path = photos["root"] / "mine" / f"{k:03d}.jpg"
            data = user_data.encode(user_data.resized(image, (40, 40), 3), "jpeg")
        else:
            path = photos["root"] / "mine" / f"{k:03d}.png"
            data = user_data.encode(image[..., None], "png")
        files[user_data.write_file(path, data)] = name
    return files


def test_prepare_images_records_counts_classes_and_the_bad_files(photos, request):
    folder = photos["folder"]
    found = manifest(photos["root"] / "data", "photos")
    assert split_sizes(found) == {"train": 2700, "test": 300}
    assert sum(folder.counts.values()) == 3000
    assert found["labels"] == {"label": {"num_classes": 10,
                                         "class_names": sorted(user_data.FASHION_CLASSES)}}
    assert folder.class_names == sorted(user_data.FASHION_CLASSES)
    assert found["schema"]["image"]["shape"] == [28, 28, 1]
    assert found["created"]["skipped"] == 2
    skipped = found["created"]["skipped_first"]
    assert [s.split(" ")[0] for s in skipped] == sorted(folder.bad)
    # Every image is in one split, with its folder's id in the sorted names:
    # the PNGs are stored unchanged, so each one is found by its pixels.
    by_pixels = {pixels.tobytes(): name for path, name, pixels in folder.files
                 if path.endswith(".png")}
    counts, found_pngs = {}, 0
    for split in ("train", "test"):
        images, labels = user_data.read_back(photos["root"] / "data" / "photos", split)
        counts[split] = np.bincount(labels, minlength=10)
        for image, label in zip(images, labels):
            name = by_pixels.get(image[..., 0].tobytes())
            if name is not None:
                assert folder.class_names[label] == name
                found_pngs += 1
    pngs = sum(1 for path, _, _ in folder.files if path.endswith(".png"))
    assert found_pngs == len(by_pixels) == pngs > 2500
    assert list(counts["train"] + counts["test"]) == [300] * 10, counts
    assert min(counts["test"]) > 0, counts
    out = photos["out"]
    assert "train 2700, test 300" in out
    assert f"{3000 - pngs} of 3000 resized" in out  # the JPEGs, of another size
    assert "skipped 2 files" in out
    assert all(bad in out for bad in folder.bad), out
    assert_shows(request, out)


def test_strict_refuses_the_folder_naming_its_unreadable_files(photos, request):
    rc, out, _ = cli("prepare", "images", "--source-dir", "photos", "--name", "photos2",
                     "--strict", cwd=photos["root"], merged=True)
    assert rc == 1, out
    assert all(bad in out for bad in photos["folder"].bad), out
    assert not os.path.exists(photos["root"] / "data" / "photos2")
    assert_shows(request, out)


@pytest.mark.slow
def test_image_classifier_on_the_folder_beats_chance(photos, photos_model, request):
    info = load_json(photos_model["export"] / "export.json")
    assert info["experiment"] == "image_classifier"
    assert info["global_step"] == 200
    assert info["class_names"] == sorted(user_data.FASHION_CLASSES)
    # 10 classes: chance is 0.1; 200 steps reach about 0.7.
    assert info["metrics"]["accuracy"] > 0.5, info["metrics"]
    assert re.search(r"final metrics: accuracy 0\.[5-9]", photos_model["out"]), \
        photos_model["out"]
    # What the tutorial shows its two commands print.
    assert_shows(request, photos["out"] + "\n" + photos_model["out"])


PREDICT_FILES = r"""
import json, sys
import numpy as np
import tensorflow as tf

export = sys.argv[1]
model = tf.keras.models.load_model(export + "/model.h5", compile=False)
names = json.load(open(export + "/export.json"))["class_names"]
height, width, channels = model.input_shape[1:]
batch = []
for path in sys.argv[2:]:
    image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                               expand_animations=False)
    batch.append(tf.image.resize(image, (height, width)))
batch = tf.stack(batch)
h5 = [names[i] for i in np.argmax(model.predict(batch, verbose=0), axis=1)]
serving = tf.saved_model.load(export + "/saved_model").signatures["serving_default"]
signature = [n.decode() for n in serving(image=batch)["class_name"].numpy()]
ours = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"h5": h5, "signature": signature, "ours": ours}))
""" % (OUR_PACKAGES,)


@pytest.mark.slow
def test_plain_keras_names_the_class_of_held_out_files(photos, photos_model, held_out):
    """model.h5 and the SavedModel, in a Python that does not import this
    package, classify the user's new image files by the names export.json
    lists."""
    paths = sorted(held_out)
    found = json.loads(plain_python(PREDICT_FILES, photos_model["export"], *paths,
                                    cwd=photos["root"]))
    assert found["ours"] == [], "the prediction process imported this package"
    right = [held_out[p] for p in paths]
    hits = sum(a == b for a, b in zip(found["h5"], right))
    # Most are right (about 0.7 of them; chance is 0.1).
    assert hits > 0.5 * len(paths), list(zip(found["h5"], right))
    # The JPEGs (colour, another size) are classified too, not only the PNGs.
    jpegs = [i for i, p in enumerate(paths) if p.endswith(".jpg")]
    assert sum(found["h5"][i] == right[i] for i in jpegs) > 0.3 * len(jpegs)
    assert found["signature"] == found["h5"]


# ---------------------------------------------------------------------------
# 2. ImageNet-style TFRecord files

# As the docs spell them (docs/howto/prepare-data.md): class 0, then Fashion-MNIST's.
IMAGENET_CLASS_NAMES = ("background,t-shirt_top,trouser,pullover,dress,coat,sandal,shirt,"
                        "sneaker,bag,ankle_boot")
IMAGENET_NAMES = tuple(IMAGENET_CLASS_NAMES.split(","))


@pytest.mark.slow
def test_imagenet_style_tfrecords_prepared_and_learned(tmp_path, request):
    """JPEG of three sizes in ``image/encoded``, 1-based ``image/class/label``
    as ImageNet's own files: 100 per class over 3 files."""
    needs_fashion()
    assert IMAGENET_NAMES[1:] == user_data.FASHION_CLASSES
    written = user_data.make_imagenet_tfrecords(tmp_path / "imagenet", per_class=100,
                                                label_offset=1)
    assert len(written.files) == 3
    # From the folder holding them, as the docs' command runs (its paths in the output).
    out, _ = ok(cli("prepare", "tfrecords", "--source", "imagenet/train-*", "--name",
                    "garments", "--image-size", "28x28", "--class-names",
                    IMAGENET_CLASS_NAMES, cwd=tmp_path, merged=True))
    assert_shows(request, out)
    found = manifest(tmp_path / "data", "garments")
    assert sum(split_sizes(found).values()) == 1000
    assert found["schema"]["image"]["shape"] == [28, 28, 3]
    assert found["labels"] == {"label": {"num_classes": 11,
                                         "class_names": list(IMAGENET_NAMES)}}
    assert "skipped nothing" in out

    out, _ = ok(cli("train", "image_classifier", "--dataset", "garments",
                    "--data-dir", tmp_path / "data", "--model-dir", tmp_path / "run",
                    "--max-steps", 250, "--eval-every", 250, *CLASSIFIER))
    info = load_json(tmp_path / "run" / "export" / "export.json")
    assert info["class_names"] == list(IMAGENET_NAMES)
    # 10 classes seen (class 0 never): chance is 0.1; 250 steps reach about 0.74.
    assert info["metrics"]["accuracy"] > 0.5, out


# ---------------------------------------------------------------------------
# 3. A segmentation folder


def mean_iou(truth, predicted, num_classes):
    """Keras's MeanIoU: the mean over classes present in the truth or the
    prediction of |both| / |either|."""
    ious = []
    for c in range(num_classes):
        union = np.logical_or(truth == c, predicted == c).sum()
        if union:
            ious.append(np.logical_and(truth == c, predicted == c).sum() / union)
    return float(np.mean(ious))


@pytest.mark.slow
def test_image_segmenter_beats_the_all_background_baseline(tmp_path, request):
    """400 garment masks (0 background, 1 tops, 2 everything else); every
    seventh pair (of every class: the maker interleaves them) 32x32, resized
    to the common 28x28."""
    needs_fashion()
    user_data.make_segmentation_folder(tmp_path / "garments", count=400, classes=3,
                                       odd_size_every=7)
    data = tmp_path / "data"
    # From the folder holding it, as the docs' command runs (its paths in the output).
    out, _ = ok(cli("prepare", "segmentation", "--source-dir", "garments", "--name",
                    "garments", cwd=tmp_path, merged=True))
    assert_shows(request, out)
    found = manifest(data, "garments")
    assert split_sizes(found) == {"train": 360, "test": 40}
    assert found["labels"]["mask"]["num_classes"] == 3

    _, masks = user_data.read_back(data / "garments", "test", label="mask")
    assert masks.shape == (40, 28, 28, 1)
    masks = masks[..., 0]
    baseline = mean_iou(masks, np.zeros_like(masks), 3)
    assert 0.1 < baseline < 0.34  # background's IoU / 3

    out, _ = ok(cli("train", "image_segmenter", "--dataset", "garments", "--data-dir", data,
                    "--model-dir", tmp_path / "run", "--max-steps", 100, "--eval-every", 100,
                    "--hparams", "filters=8"))
    metrics = load_json(tmp_path / "run" / "export" / "export.json")["metrics"]
    # 100 steps reach about 0.6 against a baseline of about 0.2.
    assert metrics["mean_iou"] > baseline + 0.2, (baseline, out)


# ---------------------------------------------------------------------------
# 4. Config files, show, MODEL_DIR/config.yaml


def write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


CONFIG = """\
data:
  dataset: not_this_one
  shuffle: record
train:
  batch_size: 16
  max_steps: 50
  learning_rate: 0.01
model:
  filters: 8
  dropout: 0.1
"""


def test_show_resolves_defaults_config_hparams_flags(tmp_path):
    config = write_text(tmp_path / "config.yaml", CONFIG)
    rc, out, err = cli("show", "image_classifier", "--config", config,
                       "--hparams", "learning_rate=0.02,dropout=0.2", "--dataset", "photos")
    assert rc == 0, err
    shown = yaml.safe_load(out)
    assert shown["name"] == "image_classifier"
    assert shown["data"]["dataset"] == "photos"            # flag over the config file
    assert shown["data"]["shuffle"] == "record"            # config file over the default
    assert shown["train"]["batch_size"] == 16              # config file
    assert shown["train"]["max_steps"] == 50
    assert shown["train"]["eval_every_steps"] == 500       # the experiment's default
    assert shown["train"]["learning_rate"] == 0.02         # --hparams over the config file
    assert shown["model"] == {"filters": 8, "blocks": 0, "dropout": 0.2, "num_classes": 0}

    # The YAML round-trips: its data/train/model sections as a config file
    # resolve to the same configuration (byte for byte).
    sections = {k: shown[k] for k in ("data", "train", "model")}
    again = write_text(tmp_path / "again.yaml", yaml.safe_dump(sections))
    rc, out2, err = cli("show", "image_classifier", "--config", again)
    assert rc == 0, err
    assert out2 == out
    # JSON is YAML too.
    as_json = write_text(tmp_path / "again.json", json.dumps(sections))
    assert cli("show", "image_classifier", "--config", as_json)[1] == out


@pytest.mark.parametrize("text, named, valid", [
    ("train:\n  max_step: 5\n", "max_step in section 'train'",
     "batch_size, deterministic, early_stopping_steps, eval_every_steps, keep_checkpoint_max, "
     "learning_rate, learning_rate_decay, log_every_steps, max_steps, optimizer, precision, seed"),
    ("data:\n  datset: x\n", "datset in section 'data'",
     "cache, cache_budget_mb, cache_shuffle, dataset"),
    ("model:\n  filter: 5\n", "'filter' in section 'model'",
     "blocks, dropout, filters, num_classes"),
    ("trian:\n  max_steps: 5\n", "section(s) trian", "data, train, model"),
])
def test_unknown_config_keys_are_refused_listing_the_valid_ones(tmp_path, text, named, valid):
    config = write_text(tmp_path / "bad.yaml", text)
    rc, out, err = cli("show", "image_classifier", "--config", config)
    assert rc == 2, (out, err)
    assert out == ""
    assert named in err and valid in err, err
    assert str(config) in err


def digits(n, seed, size=20):
    """A learnable stand-in for MNIST: class k brightens row 1 + 2k of a
    size x size noise image."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, size, size)).astype(np.uint8)
    for k in range(10):
        images[labels == k, 1 + 2 * k, :] += 180
    return images, labels


@pytest.fixture(scope="module")
def mnist_data(tmp_path_factory):
    """``prepare mnist --source-dir`` on a tiny fake MNIST written with
    write_idx: 600 + 100 digits of 20x20 (not 28x28: builders must follow
    the data)."""
    from estimator_keras.sources import write_idx  # pylint: disable=import-outside-toplevel
    root = tmp_path_factory.mktemp("mnist")
    os.makedirs(root / "idx")
    for split, n, seed in (("train", 600, 0), ("t10k", 100, 1)):
        images, labels = digits(n, seed)
        write_idx(root / "idx" / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(root / "idx" / f"{split}-labels-idx1-ubyte.gz", labels)
    out, _ = ok(cli("prepare", "mnist", "--source-dir", root / "idx", "--data-dir",
                    root / "data"))
    assert "train 600, test 100" in out
    return root / "data"


@pytest.fixture(scope="module")
def tiny_run(mnist_data, tmp_path_factory):
    """A real run of image_classifier under a config file, --hparams and
    flags; its MODEL_DIR/config.yaml as written."""
    root = tmp_path_factory.mktemp("tiny_run")
    config = write_text(root / "config.yaml", CONFIG)
    model_dir = root / "run"
    args = ("train", "image_classifier", "--data-dir", mnist_data, "--model-dir", model_dir,
            "--config", config, "--dataset", "mnist")
    ok(cli(*args, "--hparams", "batch_size=8,dropout=0.2", "--max-steps", 3))
    with open(model_dir / "config.yaml", encoding="utf-8") as f:
        recorded = yaml.safe_load(f)
    return {"args": args, "config": recorded, "model_dir": model_dir}


@pytest.mark.slow
def test_run_records_the_resolved_configuration(tiny_run, mnist_data):
    recorded = tiny_run["config"]
    assert recorded["data"]["dataset"] == "mnist"              # --dataset over the file
    assert recorded["data"]["shuffle"] == "record"             # the file over the default
    assert recorded["train"]["learning_rate"] == 0.01          # the file
    assert recorded["train"]["eval_every_steps"] == 500        # the default
    assert recorded["model"]["filters"] == 8                   # the file
    assert recorded["model"]["dropout"] == 0.2                 # --hparams over the file
    assert recorded["train"]["batch_size"] == 8                # --hparams over the file
    assert recorded["dataset_path"] == str(mnist_data / "mnist")
    assert recorded["data_info"]["inputs"] == {"image": {"shape": [20, 20, 1],
                                                         "dtype": "uint8"}}
    assert recorded["data_info"]["class_names"] == [str(d) for d in range(10)]
    assert recorded["train"]["max_steps"] == 3, "--max-steps must win over the file's 50"
    assert latest_step(tiny_run["model_dir"]) == 3


@pytest.mark.slow
def test_rerun_with_other_model_settings_is_refused(tiny_run):
    model_dir, args = tiny_run["model_dir"], tiny_run["args"]
    step = latest_step(model_dir)
    with open(model_dir / "config.yaml", encoding="utf-8") as f:
        before = f.read()
    rc, out, err = cli(*args, "--hparams", "batch_size=8,filters=4,dropout=0.2",
                       "--max-steps", step + 2)
    assert rc == 1, (out, err)  # a model dir of another model, as in test_reliability
    assert "model.filters: 8 -> 4" in err, err
    assert "dropout" not in err
    assert str(model_dir) in err
    assert latest_step(model_dir) == step
    with open(model_dir / "config.yaml", encoding="utf-8") as f:
        assert f.read() == before

    # Training settings may change: more steps, another batch size and rate
    # (the batch size changes the input order: --restart-order starts a fresh one).
    out, _ = ok(cli(*args, "--hparams", "batch_size=4,learning_rate=0.001,dropout=0.2",
                    "--max-steps", step + 2, "--restart-order"))
    assert latest_step(model_dir) == step + 2
    with open(model_dir / "config.yaml", encoding="utf-8") as f:
        after = yaml.safe_load(f)
    assert after["train"]["max_steps"] == step + 2
    assert after["train"]["batch_size"] == 4


# ---------------------------------------------------------------------------
# 5. Built-in builders follow the data


@pytest.mark.slow
def test_fashion_mnist_cnn_trains_on_mnist(mnist_data, tmp_path):
    out, _ = ok(cli("train", "fashion_mnist_cnn", "--dataset", "mnist", "--data-dir",
                    mnist_data, "--model-dir", tmp_path / "run", "--max-steps", 40,
                    "--eval-every", 40, "--hparams", "filters=8,dense_units=32"))
    info = load_json(tmp_path / "run" / "export" / "export.json")
    assert info["class_names"] == [str(d) for d in range(10)]
    assert info["inputs"]["image"]["shape"] == [20, 20, 1]
    assert info["metrics"]["accuracy"] > 0.5, out  # 40 steps reach 1.0


# ---------------------------------------------------------------------------
# 6. The docs' example module and prediction snippet, as written


@pytest.mark.slow
def test_readme_example_module_lists_and_trains(tmp_path):
    write_text(tmp_path / "my_experiments.py", readme_block("my_experiments.py"))
    out, _ = ok(cli("--module", "my_experiments.py", "list", cwd=tmp_path))
    ours = re.findall(r"^  (\w+) .*\n.*from --module my_experiments\.py$", out, re.M)
    assert ours, out
    datasets = re.findall(r"^  (\w+) .*; from --module my_experiments\.py$", out, re.M)
    assert datasets, out
    listed = ok(cli("list", cwd=tmp_path, env=child_env(EK_MODULES="my_experiments.py")))[0]
    assert all(re.search(rf"^  {n} ", listed, re.M) for n in ours + datasets), listed

    name = ours[0]
    out, _ = ok(cli("--module", "my_experiments.py", "train", name, "--max-steps", 30,
                    "--eval-every", 30, cwd=tmp_path))
    info = load_json(tmp_path / "runs" / name / "export" / "export.json")
    assert info["experiment"] == name
    assert info["class_names"], info
    assert info["metrics"]["accuracy"] > 0.9, out


@pytest.mark.slow
def test_readme_prediction_snippet_names_the_class(photos, photos_model, request):
    """The docs' predict.py, with the lines the tutorial adds to it, run as
    it is written in the project folder the tutorial's commands made, on one
    of the user's own image files, by a Python that does not import this
    package."""
    code = readme_block("predict.py") + readme_block("predict.py, continued")
    images, labels = user_data.fashion_examples(1, split="test", skip=20)
    trouser = images[list(labels).index(1)]
    named = set(re.findall(r"""["']([\w./-]+\.(?:jpe?g|png))["']""", code))
    assert named, f"predict.py names no image file:\n{code}"
    for path in named:  # a colour photo of another size, as users have
        user_data.write_file(photos["root"] / path,
                             user_data.encode(user_data.resized(trouser, (56, 56), 3), "jpeg"))
    assert os.path.isdir(photos_model["export"])
    code += ("\nimport sys\nassert not [m for m in sys.modules if m.split('.')[0] in "
             f"{OUR_PACKAGES!r}]\n")
    write_text(photos["root"] / "predict.py", code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-I", "predict.py"], cwd=str(photos["root"]),
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The class by Keras's model.h5, then by the SavedModel's signature.
    assert proc.stdout.splitlines()[0].startswith("trouser "), proc.stdout
    assert proc.stdout.splitlines()[1] == "[b'trouser']", proc.stdout
    assert_shows(request, "$ python predict.py\n" + proc.stdout)
