"""The Kubernetes backend in Airflow: its one client is the cncf-kubernetes provider's ``KubernetesHook``.

Every carbonflow operator (and the trigger that polls a deferred task's pods) builds its backend with
:func:`operator_backend`: for ``kubernetes`` the backend talks to the cluster through
``KubernetesHook(conn_id=...).get_conn()``, so the cluster is an Airflow connection of type ``kubernetes``
(``kube_config_path``, ``kube_config``, ``in_cluster``, ``cluster_context``, ``namespace``), as for the provider's
own operators. The connection's id (default ``kubernetes_default``, the provider's default: when that one is not
defined the hook uses the in-cluster service account, else ``$KUBECONFIG`` / ``~/.kube/config``) travels to the
triggerer in the backend's rebuild options; credentials never do. A ``config_file``, ``context`` or ``in_cluster``
in the operator's ``kubernetes`` options overrides the connection's, as the provider's pod operator's arguments do.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carbonflow.execution.backend import Backend, make_backend
from carbonflow.settings import k8s_context

if TYPE_CHECKING:  # the provider is imported when a backend is made, not when a DAG file is parsed
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

DEFAULT_CONN_ID = "kubernetes_default"
"""The provider's default connection id (``KubernetesHook.default_conn_name``)."""
OVERRIDES = (("config_file", "config_file"), ("context", "cluster_context"), ("in_cluster", "in_cluster"))
"""carbonflow's option → the hook's argument that overrides the connection's field."""


_CLIENT_LOCK = threading.Lock()


class KubernetesConnectionError(ValueError):
    """The Airflow connection the Kubernetes backend should use is not defined or cannot make a client."""


def operator_backend(
    name: str, workdir: Path, kubernetes: dict[str, Any] | None = None, *, conn_id: str | None = None
) -> Backend:
    """The backend called ``name`` for an operator or a trigger: ``make_backend``, with the Kubernetes client
    from the provider's hook. ``conn_id`` (an operator's ``kubernetes_conn_id``) is used unless ``kubernetes``
    names one (``conn_id``: a job's own cluster, or the id a deferred task's rebuild options carry)."""
    if name != "kubernetes":
        return make_backend(name, workdir, kubernetes)
    options = dict(kubernetes or {})
    conn_id = options.pop("conn_id", None) or conn_id or DEFAULT_CONN_ID
    given = {key: value for key, _ in OVERRIDES if (value := options.pop(key, None)) is not None}
    client, extras = _hook_client(conn_id, given)
    if not kubernetes:  # as make_backend has it: the settings from $CARBONFLOW_K8S_SETTINGS
        from carbonflow.execution.k8s_manifests import KubernetesSettings

        options = KubernetesSettings.from_env().model_dump(mode="json", exclude_unset=True)
    if "namespace" not in options and extras.get("namespace"):
        options["namespace"] = extras["namespace"]  # the connection's namespace, as the provider's operators use it
    return make_backend(name, workdir, {**options, **given, "conn_id": conn_id}, api_client=client)


def _hook_client(conn_id: str, given: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The provider hook's client for ``conn_id`` (``given``: carbonflow's overrides of its fields) and the
    connection's extra fields."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    hook = KubernetesHook(conn_id=conn_id, **{arg: given[key] for key, arg in OVERRIDES if key in given})
    extras = _extras(hook, conn_id)
    if "context" not in given and not extras.get("cluster_context") and k8s_context():
        hook.cluster_context = k8s_context()  # $CARBONFLOW_K8S_CONTEXT, when neither the task nor the connection say
    return _client(hook, conn_id), extras


def _extras(hook: KubernetesHook, conn_id: str) -> dict[str, Any]:
    """The connection's extra fields (empty for an undefined ``kubernetes_default``, as the provider has it)."""
    from airflow.providers.common.compat.sdk import AirflowNotFoundException

    try:
        return dict(hook.conn_extras)
    except AirflowNotFoundException:
        env = f"AIRFLOW_CONN_{conn_id.upper()}"
        raise KubernetesConnectionError(
            f"kubernetes_conn_id={conn_id!r}: no Airflow connection of that id is defined. Define one of type "
            f"kubernetes (Admin → Connections, `airflow connections add {conn_id} --conn-type kubernetes "
            f"--conn-extra '{{...}}'`, or ${env} as JSON), or name a defined one (default {DEFAULT_CONN_ID!r})"
        ) from None


def _client(hook: KubernetesHook, conn_id: str) -> Any:
    """The hook's ``ApiClient``; a connection that cannot make one fails naming it. One at a time: the hook loads
    the kubeconfig into the kubernetes client's process-wide default configuration and copies it into the client,
    and the triggerer makes clients in threads, maybe from different connections."""
    try:
        with _CLIENT_LOCK:
            return hook.get_conn()
    except Exception as err:
        raise KubernetesConnectionError(
            f"kubernetes_conn_id={conn_id!r}: the Kubernetes client could not be made from this connection "
            f"({type(err).__name__}: {err})"
        ) from err
