"""A run's identity: which config keys decide what a run computes, and the hash and directory made of them.

A run directory is ``<out_dir>/<exp>/<method>/<dataset>-<scheme>-s<seed>-<hash[:10]>`` with ``hash`` the sha256 of
the run's *semantic* config (sorted-key JSON). Every key of the config is classified here, explicitly:

- :data:`SEMANTIC` keys enter the hash;
- :data:`OPEN_SECTIONS` (``dataset``, ``partition``, ``model``, ``method``) enter whole: what the chosen config
  group declares (a method's hyperparameters, a partitioner's parameters, a model's arguments, a data set's
  settings), except the keys listed in :data:`NON_SEMANTIC` or :data:`ADDED`;
- :data:`NON_SEMANTIC` keys never do (where results go, logging, devices and threads, caches);
- :data:`ADDED` keys came after runs existed: each names the value at which it changes nothing, and is left out
  of the hash at that value, so that the runs from before the key keep their directories.

A key in none of these lists is refused (:class:`UnclassifiedKey`, a configuration error naming the key and the
fix) instead of silently entering or leaving the hash: a new key of ``conf/config.yaml`` moves no existing run
until someone decides which list it belongs to (``tests/test_identity.py`` checks that every key of
``conf/config.yaml`` is classified). Inside an open section, :data:`GROUP_KEYS` lists the keys each option's file
declared at version 1; a new one (a method's new hyperparameter) is refused by the same test until it goes to
:data:`ADDED` with its neutral value, or to :data:`GROUP_KEYS` when its default is meant to move that option's
runs.

:data:`IDENTITY_VERSION` names this rule. Version 1 is the hash every committed run was named by (every key
except the non-semantic ones and the added ones at their neutral values); a change of which keys enter, or of
how they are written, is a new version and keeps the old one's function here so that old runs are still found.

This module imports neither torch nor the methods: readers of run directories use it without either.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: the rule a run's config hash is computed by (see the module's docstring)
IDENTITY_VERSION = 1

#: keys that decide what a run computes, dotted for a key inside a section
SEMANTIC = frozenset({
    "exp", "seed", "data_seed", "num_clients", "participation", "rounds",
    *(f"train.{key}" for key in ("optimizer", "lr", "lr_decay", "momentum", "nesterov", "weight_decay", "epochs",
                                 "batch_size", "drop_last", "grad_clip")),
    "eval.every", "eval.batch_size", "eval.primary",
    "capacity.setting", "capacity.low", "capacity.high",
})

#: sections that enter whole (what the chosen config group declares), less their NON_SEMANTIC and ADDED keys
OPEN_SECTIONS = frozenset({"dataset", "partition", "model", "method"})

#: keys that do not change what is computed (where results go, logging, devices, threads, caches, and the margin of
#: the "did not train" verdict, which changes no record)
NON_SEMANTIC = frozenset({
    "out_dir", "run_dir", "quiet", "logger", "device", "threads", "checkpoint", "client_state", "cache_dir",
    "imports", "data_root", "hydra", "dataset.root", "dataset.download", "partition.path", "eval.chance_z",
})


def _equals(neutral: Any) -> Callable[[Any], bool]:
    return lambda value: value == neutral and type(value) is type(neutral)


#: keys added after runs existed -> "this value changes nothing": left out of the hash at that value, so that the runs
#: from before the key keep their directories (``capacity`` as a whole: every client at full width)
ADDED: dict[str, Callable[[Any], bool]] = {
    "capacity": lambda value: isinstance(value, Mapping) and value.get("setting") == "ideal",
    "compile": _equals(False),
    "train.norm_mode": _equals("train"),
    "train.batched_clients": _equals(False),
    "train.keep_optimizer_state": _equals(False),
    "eval.early_stop": lambda value: value is None,
    "eval.stages": lambda value: value is None,
    "method.layer_order": _equals("recover"),
    "method.round1_critical": _equals("customized"),
    "method.label_mask": _equals(False),  # FedRolex's (HeteroFL's default, true, stays in its hash)
    "method.weights": _equals("samples"),  # FedRolex's
    "method.window": _equals("forward"),  # FedRolex's
    "method.gate_momentum": _equals(0.0),  # pFedGate's
    "method.gate_weight_decay": _equals(0.0),  # pFedGate's
    "method.relu_logits": _equals(False),  # pFedGate's
    "method.score_levels": lambda value: value is None,  # pFedGate's
    "method.straight_through": _equals(False),  # pFedGate's
    "method.narrow_init": _equals("prefix"),  # FLANC's
    "method.attention": _equals("distance"),  # FedAMP's (the distance form)
    "method.alpha_decay": _equals(1.0),  # FedAMP's
    "method.decay_every": _equals(0),  # FedAMP's
    "method.cos_scale": _equals(25.0),  # FedAMP's (read by the cosine form only)
    "method.self_weight": lambda value: value is None,  # FedAMP's (read by the cosine form only)
    **{f"{where}.{key}": neutral for where in ("capacity", "method.federation.capacity")
       for key, neutral in (("width_rule", _equals("method")), ("width_step", lambda value: value is None))},
}


#: the keys each file of an open section declared (``conf/<section>/<option>.yaml``, ``defaults`` aside) when identity
#: version 1 was fixed. A file's key beyond these (a method's new hyperparameter, a new method's file) is refused by
#: :func:`unlisted_group_keys` (checked by ``tests/test_identity.py``) until it goes to ADDED with the value at which
#: it changes nothing, or here, deliberately moving that option's runs
GROUP_KEYS: dict[str, str] = {
    "dataset/cifar10": ("name source image_size channels download train_transform test_transform n_train_per_client "
                        "n_test_per_client"),
    "dataset/cifar100": ("name source image_size channels download train_transform test_transform n_train_per_client "
                         "n_test_per_client"),
    "dataset/digit5": ("name domains image_size channels options.max_test_per_class train_transform test_transform "
                       "n_train_per_client n_test_per_client"),
    "dataset/digit5_standin": ("name domains image_size channels options.size options.train_per_class "
                               "options.test_per_class options.cache_dir train_transform test_transform "
                               "n_train_per_client n_test_per_client"),
    "dataset/digit5_standin4": ("name domains image_size channels options.size options.train_per_class "
                                "options.test_per_class options.cache_dir train_transform test_transform "
                                "n_train_per_client n_test_per_client"),
    "dataset/digits": ("name source image_size channels train_transform test_transform n_train_per_client "
                       "n_test_per_client"),
    "dataset/fashion_mnist": ("name source image_size channels train_transform test_transform n_train_per_client "
                              "n_test_per_client"),
    "dataset/mnist": ("name source image_size channels download train_transform test_transform n_train_per_client "
                      "n_test_per_client"),
    "dataset/mnist5k": ("name source image_size channels train_transform test_transform n_train_per_client "
                        "n_test_per_client"),
    "dataset/office10": ("name domains image_size channels options.size train_transform test_transform "
                         "n_train_per_client n_test_per_client"),
    "dataset/office10_standin": ("name domains image_size channels options.size options.train_per_class "
                                 "options.test_per_class options.cache_dir train_transform test_transform "
                                 "n_train_per_client n_test_per_client"),
    "dataset/svhn": ("name source image_size channels download train_transform test_transform n_train_per_client "
                     "n_test_per_client"),
    "dataset/synthetic": ("name source image_size channels options.num_train options.num_test options.num_classes "
                          "options.num_channels options.size options.noise options.seed train_transform test_transform "
                          "n_train_per_client n_test_per_client"),
    "dataset/tiny_imagenet": ("name source image_size channels train_transform test_transform n_train_per_client "
                              "n_test_per_client"),
    "dataset/usps": ("name source image_size channels download train_transform test_transform n_train_per_client "
                     "n_test_per_client"),
    "model/cnn_cifar100": "name width options pretrained",
    "model/cnn_fedavg": "name width options.norm pretrained",
    "model/cnn_fmnist": "name width options pretrained",
    "model/cnn_heterofl": "name width options.channels options.norm pretrained",  # new model: moves no old run
    "model/cnn_pfedhn": "name width options.norm options.conv1_padding pretrained",
    "model/lenet64": "name width options pretrained",
    "model/resnet10": "name width options pretrained",
    "model/resnet18": "name width options.norm options.gn_groups pretrained",
    "model/resnet18_gn": "name width options.norm options.gn_groups pretrained",
    "model/resnet8": "name width options pretrained",
    "model/small_cnn": "name width options.channels options.hidden options.norm pretrained",
    "partition/class_mix": "scheme mixes n_train n_test overlap val_fraction",  # new scheme: moves no old run
    "partition/classes_per_client": "scheme k test_mode test_fraction val_fraction",
    "partition/dirichlet": "scheme alpha n_train n_test prior overlap val_fraction",
    "partition/dirichlet_hsu": "scheme alpha min_size max_retries test_mode test_fraction val_fraction",
    "partition/domain": "scheme clients_per_domain train_per_class test_per_class val_fraction",
    "partition/from_file": "scheme path sha256 dataset_name val_fraction",
    "partition/iid": "scheme test_mode test_fraction val_fraction",
    "partition/pathological": "scheme classes_per_client n_train n_test overlap val_fraction",
    "partition/shards": "scheme shards_per_client num_users train_per_class test_per_class val_fraction",
    "method/ditto": "name lam personal_epochs",
    "method/fedalt": "name alt_epochs alt_schedule",
    "method/fedamp": "name alpha_k lam sigma start",
    "method/fedavg": "name",
    "method/fedbabu": "name finetune_epochs finetune_part",
    "method/fedbn": "name",
    "method/fedc2i": "name gamma extractor classifier class_features batch_size",
    "method/fedcac": "name tau beta selection collaboration top_k noncritical overlap bn_stats overlap_matrix_every",
    "method/fedper": "name",
    "method/fedproto": "name lam penalty weighting prototypes prediction",
    "method/fedprox": "name mu",
    "method/fedrep": "name head_epochs body_epochs",
    "method/fedrod": "name personal_init",
    "method/fedrolex": "name width_rule width_step scaler static_bn",
    "method/fedselect": ("name p ltn_iters ltn_epochs fraction ltn_return maskable ranking alt_epochs alt_schedule "
                         "weighting bn_stats unsampled"),
    "method/fedselect_cvpr": ("name grow_every grow_rate target maskable ranking alt_epochs alt_schedule weighting "
                              "bn_stats unsampled"),
    "method/fjord": "name width_rule width_step sample_widths distill distill_weight temperature scaler static_bn",
    "method/flanc": "name lam basis_ratio basis_width width_step",
    "method/heterofl": "name width_rule width_step scaler static_bn label_mask",
    "method/lgfedavg": "name global_layers",
    "method/local": "name",
    "method/lotteryfl": "name acc_threshold prune_step prune_target rewind prune_split maskable ranking",
    "method/pa3dfl": ("name lam hn_lr hn_momentum embed_dim hidden_dim encoder_depth rank_width rank_scale width_step "
                      "tau_init embed_std init_entropy decoder_init hn_clip orth_reduction detach_local width_params "
                      "fusion_steps fusion_space ties_to_global decomposition basis_ratio personal_aggregation "
                      "federation.capacity federation.num_clients federation.data_seed"),
    "method/perfedmask": "name budget freeze_head finetune_epochs finetune_momentum finetune_weight_decay",
    "method/pfedgate": "name sparsity blocks_per_tensor gate_lr gate_clip gate_pool gate_bias",
    "method/pfedhn": ("name embed_dim hidden_dim hidden_layers lr momentum weight_decay outer_clip inner_lr "
                      "inner_momentum inner_weight_decay inner_clip inner_steps personal_classifier"),
    "method/tailorfl": "name lam alpha deep_fraction tune_every width_step scale",
}


def _flat_keys(node: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, value in node.items():
        if isinstance(value, Mapping) and value:
            out += _flat_keys(value, f"{prefix}{name}.")
        elif name != "defaults" or prefix:
            out.append(f"{prefix}{name}")
    return out


def unlisted_group_keys(conf_dir: str | Path) -> list[str]:
    """``<file>: <key>`` for every key a config group file of an open section declares that neither
    :data:`GROUP_KEYS` lists for that file nor :data:`ADDED` or :data:`NON_SEMANTIC` classify: a key that would
    move every existing run of that option (empty when every key is accounted for)."""
    import yaml

    out = []
    for section in sorted(OPEN_SECTIONS):
        for path in sorted(Path(conf_dir, section).glob("*.yaml")):
            listed = set(GROUP_KEYS.get(f"{section}/{path.stem}", "").split())
            for key in _flat_keys(yaml.safe_load(path.read_text()) or {}):
                dotted = f"{section}.{key}"
                if key not in listed and dotted not in ADDED and dotted not in NON_SEMANTIC:
                    out.append(f"{path}: {key}")
    return out


class UnclassifiedKey(ValueError):
    """A config key that :mod:`bench.experiment.identity` does not classify: it would enter or leave every run's hash
    silently."""


def _classify(key: str) -> str:
    """``"semantic"``, ``"non-semantic"``, ``"added"``, ``"section"`` (a closed section: look inside) or
    ``"unclassified"`` for a dotted key."""
    if key in NON_SEMANTIC:
        return "non-semantic"
    if key in ADDED:
        return "added"
    if key in SEMANTIC or key.split(".")[0] in OPEN_SECTIONS:
        return "semantic"
    return "section" if _has_keys_below(key) else "unclassified"


def _has_keys_below(key: str) -> bool:
    """Whether some key of this module's lists lies inside ``key`` (which is then classified key by key)."""
    return any(k.startswith(key + ".") for k in (*SEMANTIC, *NON_SEMANTIC, *ADDED))


def semantic_config(cfg: Mapping[str, Any], version: int = IDENTITY_VERSION) -> dict[str, Any]:
    """The part of a resolved config that a run's identity is made of (a new dict; ``cfg`` is left as it is).
    Raises :class:`UnclassifiedKey` for a key that is in none of this module's lists."""
    if version != 1:
        raise ValueError(f"identity version {version} is unknown: this tree knows version 1")

    def keep(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out = {}
        for name, value in node.items():
            key = f"{prefix}{name}"
            kind = _classify(key)
            if kind == "unclassified":
                raise UnclassifiedKey(
                    f"config key {key!r} is not classified in bench/experiment/identity.py: add it to SEMANTIC (it "
                        "changes what a "
                    "run computes: every existing run with it moves), to ADDED with the value at which it changes "
                    "nothing (existing runs keep their directories) or to NON_SEMANTIC")
            if kind == "non-semantic" or (kind == "added" and ADDED[key](value)):
                continue
            inside = key.split(".")[0] in OPEN_SECTIONS or _has_keys_below(key)
            out[name] = keep(value, f"{key}.") if isinstance(value, Mapping) and inside else value
        return out

    return keep(json.loads(json.dumps(cfg)), "")


def config_hash(cfg: Mapping[str, Any], version: int = IDENTITY_VERSION) -> str:
    """sha256 over the semantic part of the resolved config (:func:`semantic_config`), as sorted-key JSON."""
    return hashlib.sha256(json.dumps(semantic_config(cfg, version), sort_keys=True).encode()).hexdigest()


def run_dir_for(cfg: Mapping[str, Any]) -> Path:
    """A run's directory: ``run_dir`` when set, else ``<out_dir>/<exp>/<method>/<dataset>-<scheme>-s<seed>-<hash>``
    with the first ten hex digits of :func:`config_hash`."""
    if cfg.get("run_dir"):
        return Path(cfg["run_dir"])
    name = f"{cfg['dataset']['name']}-{cfg['partition']['scheme']}-s{cfg['seed']}-{config_hash(cfg)[:10]}"
    return Path(cfg["out_dir"]) / cfg.get("exp", "default") / cfg["method"]["name"] / name
