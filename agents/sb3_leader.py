"""SB3LeaderPolicy: a Leader trained with stable-baselines3 on the macro-action view
(``envs.leader_view``), playing in any SearchTeam episode through the usual ``act``.

It reads each Leader observation's ``info`` the way :class:`envs.leader_view.LeaderMacroEnv` did in
training (the same :class:`~envs.leader_view.LeaderMacro` code), asks its model for a
macro-action, and writes the protocol text: ``<subtask>...</subtask>`` x n on the
decomposition policy's sub-tasks, or ``<select>...</select>``. It plays the Leader only;
route the other roles elsewhere (``leader=sb3:runs/sb3_leader,searcher=scripted,...``).

A saved Leader is two files side by side, both data: ``leader.safetensors`` (the SB3
policy's ``state_dict``) and ``leader.json`` (its settings, :func:`save_leader`). The policy
is rebuilt from the settings and the weights are copied in: nothing in a Leader folder is
unpickled. SB3's own zip (``leader.zip``, as saved before) cloudpickles part of its
settings, so loading it could run code: it is refused, and ``python -m algos
train-leader-sb3 --resave DIR`` rewrites it in this form (:func:`resave_leader`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Observation
from envs import protocol as P
from envs.leader_view import FEATURES, LeaderMacro, Proposal, turn_text
from envs.terminal import first_line

MODEL_FILE, META_FILE = "leader.safetensors", "leader.json"
SB3_ZIP = "leader.zip"
"""What ``train-leader-sb3`` saved before: SB3's zip, refused on load (see the module doc)."""
FORMAT = "sb3-leader-safetensors-1"
ALGOS = ("ppo", "a2c", "dqn")
DECOMPOSERS = ("scripted", "random", "hf:smollm2")
"""The decomposition policies a Leader may name: built-in specs only, never a ``python:``
class or a path (a ``leader.json`` is data, and data does not choose code to run)."""
ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "leaky_relu": "LeakyReLU", "gelu": "GELU",
               "silu": "SiLU"}
"""``activation_fn`` by name in ``leader.json`` -> its ``torch.nn`` class."""
NETWORK_KWARGS = ("net_arch", "activation_fn", "share_features_extractor", "normalize_images")
"""The ``policy_kwargs`` a Leader keeps: those that shape the network. The optimizer's
(``optimizer_class``, ``optimizer_kwargs``) and initialisation's (``ortho_init``) only
matter in training and are dropped; any other key is refused before training."""
_TRAINING_ONLY_KWARGS = ("optimizer_class", "optimizer_kwargs", "ortho_init")
MAX_WIDTH = 4096
"""Widest layer a Leader's ``net_arch`` may name (its observation has 14 features)."""
MAX_LAYERS = 16
"""Most hidden layers a Leader's ``net_arch`` may name, per network."""
DEFAULT_NET_ARCH = [64, 64]
"""SB3's ``MlpPolicy`` layers when ``policy_kwargs`` names none (each of PPO's and A2C's two
networks, DQN's Q-network)."""
_MAX_HEADER = 1 << 20  # a Leader's safetensors header is a few hundred bytes


def algo_class(name: str) -> Any:
    """The stable-baselines3 class of ``ppo``, ``a2c`` or ``dqn``."""
    import stable_baselines3

    if name not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {name!r}")
    return getattr(stable_baselines3, name.upper())


def network_settings(policy_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``policy_kwargs`` as the plain JSON ``leader.json`` keeps (:data:`NETWORK_KWARGS`;
    an activation class by its :data:`ACTIVATIONS` name). Raises ``ValueError`` naming
    a key that cannot be kept, so the trainer refuses it before training."""
    import torch

    names = {getattr(torch.nn, cls): name for name, cls in ACTIVATIONS.items()}
    out: dict[str, Any] = {}
    for key, value in (policy_kwargs or {}).items():
        if key in _TRAINING_ONLY_KWARGS or (key == "use_sde" and value is False):
            continue
        if key not in NETWORK_KWARGS:
            raise ValueError(f"policy_kwargs {key!r} cannot be saved with an SB3 Leader: use only "
                             f"{', '.join(NETWORK_KWARGS)} (and the optimizer's, which are not saved)")
        if key == "activation_fn" and not isinstance(value, str):
            if value not in names:
                raise ValueError(f"policy_kwargs activation_fn {value!r} cannot be saved: use one of "
                                 f"torch.nn.{', torch.nn.'.join(ACTIVATIONS.values())}")
            value = names[value]
        if not _plain(value):
            raise ValueError(f"policy_kwargs {key}={value!r} is not plain JSON (numbers, strings, "
                             "booleans, lists, objects), so a saved Leader cannot keep it")
        out[key] = value
    check_network(out, None, "policy_kwargs")
    return out


def check_network(network: Mapping[str, Any], algo: str | None, where: str) -> None:
    """Raise a one-line ``ValueError`` naming ``where`` unless ``network`` (the
    ``policy_kwargs`` of :data:`NETWORK_KWARGS`) is one a Leader may build, within
    :data:`MAX_LAYERS`, :data:`MAX_WIDTH` and :data:`ACTIVATIONS`. Checks the settings only;
    ``SB3LeaderPolicy`` compares them with the saved tensors."""
    if not isinstance(network, Mapping):
        raise ValueError(f"{where}: policy_kwargs must be a JSON object, got {_brief(network)}")
    arch = DEFAULT_NET_ARCH if network.get("net_arch") is None else network["net_arch"]
    if isinstance(arch, Mapping) and algo != "dqn":
        if not arch or set(arch) - {"pi", "vf"}:
            raise ValueError(f"{where}: net_arch as an object must have keys among pi, vf, got {_brief(arch)}")
        layers = list(arch.items())
    elif isinstance(arch, (list, tuple)):
        layers = [("net_arch", arch)]
    else:
        shape = "a list of widths" + ("" if algo == "dqn" else " or {\"pi\": [...], \"vf\": [...]}")
        raise ValueError(f"{where}: net_arch must be {shape}, got {_brief(arch)}")
    for name, widths in layers:
        if not isinstance(widths, (list, tuple)) or len(widths) > MAX_LAYERS or not all(
                type(w) is int and 1 <= w <= MAX_WIDTH for w in widths):
            raise ValueError(f"{where}: {'' if name == 'net_arch' else 'net_arch.'}{name} must be a list of at "
                             f"most {MAX_LAYERS} integer widths in [1, {MAX_WIDTH}], got {_brief(widths)}")
    activation = network.get("activation_fn", "tanh")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{where}: activation_fn must be one of {', '.join(ACTIVATIONS)}, got {_brief(activation)}")
    for key in ("share_features_extractor", "normalize_images"):
        if key in network and not isinstance(network[key], bool):
            raise ValueError(f"{where}: {key} must be true or false, got {_brief(network[key])}")
    if algo == "dqn" and "share_features_extractor" in network:
        raise ValueError(f"{where}: a DQN Leader has no share_features_extractor setting")


def _brief(value: Any) -> str:
    text = json.dumps(value) if _plain(value) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def expected_shapes(algo: str, macro: LeaderMacro, network: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The ``state_dict`` shapes of the SB3 ``MlpPolicy`` that :func:`build_policy` would
    build for ``algo`` on ``macro``'s spaces, computed from ``network`` alone (nothing is
    built; ``network`` passed :func:`check_network`)."""
    obs, n = int(macro.observation_space.shape[0]), int(macro.action_space.n)
    arch = DEFAULT_NET_ARCH if network.get("net_arch") is None else network["net_arch"]
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(prefix: str, dims: Sequence[int]) -> None:
        for i, (fan_in, fan_out) in enumerate(zip(dims, dims[1:])):
            shapes[f"{prefix}.{2 * i}.weight"] = (fan_out, fan_in)
            shapes[f"{prefix}.{2 * i}.bias"] = (fan_out,)

    if algo == "dqn":
        for prefix in ("q_net.q_net", "q_net_target.q_net"):
            linear(prefix, [obs, *arch, n])
        return shapes
    pi, vf = (arch.get("pi", []), arch.get("vf", [])) if isinstance(arch, Mapping) else (arch, arch)
    linear("mlp_extractor.policy_net", [obs, *pi])
    linear("mlp_extractor.value_net", [obs, *vf])
    shapes["action_net.weight"], shapes["action_net.bias"] = (n, pi[-1] if pi else obs), (n,)
    shapes["value_net.weight"], shapes["value_net.bias"] = (1, vf[-1] if vf else obs), (1,)
    return shapes


def _read_weights(path: Path, wanted: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The tensors of the safetensors file ``path``, read once its header has named exactly
    the tensors ``wanted`` (name -> shape); one-line ``ValueError`` naming the file else."""
    from safetensors.torch import load_file

    bad = (f"{path}: not a readable safetensors file (%s); retrain the Leader with "
           "`python -m algos train-leader-sb3 --out DIR`")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < size <= _MAX_HEADER:
                raise ValueError(bad % "no header of a sane size")
            header = json.loads(f.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(bad % first_line(err)) from None
    if not isinstance(header, dict):
        raise ValueError(bad % "its header is not a JSON object")
    found = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(bad % f"tensor {name!r} has no shape")
        found[name] = tuple(shape)
    wrong = ([f"missing {k!r}" for k in wanted if k not in found]
             + [f"unexpected {k!r}" for k in found if k not in wanted]
             + [f"{k!r} has shape {found[k]}, expected {wanted[k]}" for k in wanted
                if k in found and found[k] != wanted[k]])
    if wrong:
        raise ValueError(f"{path}: its tensors do not fit the policy its leader.json describes "
                         f"({wrong[0]}{f' and {len(wrong) - 1} more' if len(wrong) > 1 else ''}); retrain the Leader")
    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # safetensors raises its own errors for a bad header or a short file
        raise ValueError(bad % first_line(err)) from None


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def build_policy(algo: str, macro: LeaderMacro, network: Mapping[str, Any]) -> Any:
    """A fresh SB3 ``MlpPolicy`` of ``algo`` on ``macro``'s spaces, shaped by ``network``
    (:func:`network_settings`' output); its weights are random until loaded."""
    import torch

    kwargs = dict(network)
    if "activation_fn" in kwargs:  # a name check_network accepted
        kwargs["activation_fn"] = getattr(torch.nn, ACTIVATIONS[kwargs["activation_fn"]])
    cls = algo_class(algo).policy_aliases["MlpPolicy"]
    # lr_schedule only sets up an optimizer that a Leader in use never steps
    policy = cls(macro.observation_space, macro.action_space, lambda _: 0.0, **kwargs)
    policy.set_training_mode(False)
    return policy


def save_leader(model: Any, out: str | Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Write a trained SB3 ``model`` to ``out``: ``leader.safetensors`` (its policy's
    weights) and ``leader.json`` (``meta`` -- which must name ``algo``, ``max_waves``,
    ``max_searchers``, ``max_context_tokens`` and ``decompose`` -- plus the format, the
    feature names and the network settings). Returns what ``leader.json`` holds."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {**meta, "format": FORMAT, "features": list(FEATURES),
                "policy_kwargs": network_settings(model.policy_kwargs)}
    _check_settings(settings, out / META_FILE)
    # clone: tensors that share storage (a shared extractor) each get their own copy
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in model.policy.state_dict().items()},
              str(out / MODEL_FILE), metadata={"format": FORMAT, "algo": settings["algo"]})
    (out / META_FILE).write_text(json.dumps(settings, indent=2))
    return settings


def _check_settings(meta: Any, where: Path) -> None:
    """Raise a one-line ``ValueError`` naming ``where`` when ``meta`` is not a Leader's settings."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: expected a JSON object of Leader settings, got {type(meta).__name__}")
    if meta.get("decompose", "scripted") not in DECOMPOSERS:
        raise ValueError(f"{where}: decomposer {meta.get('decompose')!r} is not a built-in one "
                         f"({', '.join(DECOMPOSERS)}); retrain the Leader with --decompose one of them")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{where}: not a Leader saved as safetensors + JSON (format "
                         f"{meta.get('format')!r}, expected {FORMAT!r}): {_RESAVE}")
    if meta.get("algo") not in ALGOS:
        raise ValueError(f"{where}: algo {meta.get('algo')!r} is not one of {', '.join(ALGOS)}")
    for key in ("max_waves", "max_searchers", "max_context_tokens"):
        if type(meta.get(key)) is not int or meta[key] < 1:
            raise ValueError(f"{where}: {key} must be a positive integer, got {meta.get(key)!r}")
    if tuple(meta.get("features", ())) != FEATURES:
        raise ValueError(f"{where}: trained on features {meta.get('features')}, this code computes "
                         f"{list(FEATURES)}: retrain the Leader")
    network = meta.get("policy_kwargs", {})
    if not isinstance(network, dict) or set(network) - set(NETWORK_KWARGS) or not _plain(network):
        raise ValueError(f"{where}: policy_kwargs must be a JSON object with keys among "
                         f"{', '.join(NETWORK_KWARGS)}, got {_brief(network)}")
    check_network(network, meta["algo"], f"{where}: policy_kwargs")


_RESAVE = ("re-save it with `python -m algos train-leader-sb3 --resave DIR` (reads only its weights and "
           "plain settings), or retrain with `python -m algos train-leader-sb3 --out DIR`")


def resave_leader(path: str | Path) -> Path:
    """Rewrite a Leader saved as SB3's zip (``DIR/leader.zip`` + ``DIR/leader.json``) as
    ``leader.safetensors`` + ``leader.json``, reading only the zip's ``policy.pth``
    (``torch.load(weights_only=True)``) and the plain-JSON ``policy_kwargs`` of its
    ``data``: nothing is unpickled. Returns the weights file; the zip is left in place and
    is no longer read (delete it)."""
    import io
    import pickle
    import zipfile

    import torch

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    zip_path, meta_path = folder / SB3_ZIP, folder / META_FILE
    for needed in (zip_path, meta_path):
        if not needed.exists():
            raise FileNotFoundError(f"no {needed.name} to re-save in {folder}")
    try:
        meta = json.loads(meta_path.read_text())
        with zipfile.ZipFile(zip_path) as z:
            data = json.loads(z.read("data"))
            state = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True, map_location="cpu")
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, pickle.UnpicklingError, RuntimeError) as err:
        raise ValueError(f"{zip_path}: cannot re-save ({first_line(err)}); retrain the Leader") from None
    if not isinstance(meta, dict) or not isinstance(data, dict) or not isinstance(state, dict):
        raise ValueError(f"{zip_path}: not an SB3 Leader's zip and settings; retrain the Leader")
    # SB3 pickles policy_kwargs whole when one value is a class (A2C adds its optimizer's):
    # then the copy the trainer wrote into leader.json, as text, is the one to read
    network = data.get("policy_kwargs", {})
    if not isinstance(network, dict) or ":serialized:" in network:
        network = (meta.get("hyperparams") or {}).get("policy_kwargs", {})
    if not isinstance(network, dict) or ":serialized:" in network or not _plain(network):
        raise ValueError(f"{zip_path}: its policy_kwargs are pickled, not plain JSON; retrain the Leader")
    meta = {**meta, "format": FORMAT, "policy_kwargs": network_settings(network)}
    _check_settings(meta, meta_path)
    policy = build_policy(meta["algo"], _macro(meta), meta["policy_kwargs"])
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{zip_path}: its policy.pth does not fit {meta_path} ({first_line(err)})") from None
    model = type("Saved", (), {"policy": policy, "policy_kwargs": meta["policy_kwargs"]})()
    save_leader(model, folder, meta)
    return folder / MODEL_FILE


def _macro(meta: Mapping[str, Any]) -> LeaderMacro:
    return LeaderMacro(meta["max_waves"], meta["max_searchers"], meta["max_context_tokens"])


def make_decomposer(spec: str, seed: int = 0, make_policy: Callable[..., Any] | None = None) -> Any:
    """The decomposition policy a Leader was trained with: one of :data:`DECOMPOSERS`,
    ``scripted`` here and the others by ``make_policy`` (``agents.registry.make_policy``,
    passed in so that this module does not import the registry that imports it)."""
    if spec not in DECOMPOSERS:
        raise ValueError(f"decomposer {spec!r} is not a built-in one: use one of {', '.join(DECOMPOSERS)}")
    if spec == "scripted":
        from agents.scripted import ScriptedPolicy

        return ScriptedPolicy(seed=seed)
    if make_policy is None:
        raise ValueError(f"decomposer {spec!r} is not 'scripted': pass make_policy="
                         "agents.registry.make_policy to build it")
    return make_policy(spec, seed=seed)


class SB3LeaderPolicy:
    """A stable-baselines3 Leader; ``act`` takes Leader observations only.

    Args:
        path: the run directory (``leader.safetensors`` + ``leader.json``) or the weights file.
        deterministic: take the model's most likely macro-action (else sample; a DQN
            Leader's Q-values have nothing to sample from, so it is greedy either way).
        seed: the decomposition policy's seed.
        make_policy: builds a decomposition policy that is not ``scripted`` from its spec
            (``agents.registry.make_policy``; the registry passes itself).
    """

    def __init__(self, path: str | Path, *, deterministic: bool = True, seed: int = 0,
                 make_policy: Callable[..., Any] | None = None):
        path = Path(path)
        model_path, meta_path = ((path / MODEL_FILE, path / META_FILE) if path.is_dir()
                                 else (path, path.with_suffix(".json")))
        sb3_zip = model_path if model_path.suffix == ".zip" else model_path.parent / SB3_ZIP
        if sb3_zip.exists() and (model_path == sb3_zip or not model_path.exists()):
            raise ValueError(f"{sb3_zip}: an SB3 zip, whose settings are pickled (loading them could run "
                             f"code), is not loaded; {_RESAVE}")
        if not model_path.exists() or not meta_path.exists():
            raise FileNotFoundError(f"no SB3 Leader at {path}: need {model_path} and {meta_path} "
                                    "(train one with python -m algos train-leader-sb3)")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{meta_path}: not JSON ({first_line(err)})") from None
        _check_settings(self.meta, meta_path)
        self.macro = _macro(self.meta)
        # the settings against the saved tensors' shapes, before anything is built
        wanted = expected_shapes(self.meta["algo"], self.macro, self.meta["policy_kwargs"])
        state = _read_weights(model_path, wanted)
        self.model = build_policy(self.meta["algo"], self.macro, self.meta["policy_kwargs"])
        """The SB3 policy (``predict(obs, deterministic)``), its weights from ``leader.safetensors``."""
        self.model.load_state_dict(state, strict=True)
        self.decomposer = make_decomposer(self.meta.get("decompose", "scripted"), seed, make_policy)
        self.deterministic = deterministic

    def act(self, observations: Sequence[Observation]) -> list[str]:
        if not observations:
            return []
        wrong = [o.agent for o in observations if o.role != P.LEADER]
        if wrong:
            raise ValueError(f"SB3LeaderPolicy plays the Leader only, got {wrong}; route other roles "
                             "elsewhere, e.g. leader=sb3:<path>,searcher=scripted,answerer=scripted")
        proposals = self.decomposer.act(list(observations))
        states, feats = [], []
        for obs, proposed in zip(observations, proposals, strict=True):
            state = self.macro.state(obs.info)
            proposal = Proposal.of_turn(turn_text(proposed, obs.decode or _no_decode), state)
            states.append((state, proposal))
            feats.append(self.macro.features(state, len(obs.token_ids), proposal))
        actions, _ = self.model.predict(np.stack(feats), deterministic=self.deterministic)
        return [self.macro.turn(min(int(a), self.macro.max_searchers), state, proposal)
                for a, (state, proposal) in zip(np.asarray(actions).reshape(-1), states)]


def _no_decode(ids: Sequence[int]) -> str:
    raise ValueError("the decomposition policy returned token ids but the observation has no decoder")
