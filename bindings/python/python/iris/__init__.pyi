"""Type hints of the ``iris`` package: every ``iris serve`` option by keyword
(docs/configuration.md has their meaning; ``None`` or leaving one out
keeps the CLI default or the ``IRIS_…`` environment twin)."""

import os
from typing import Any, Literal, Mapping, Sequence, Union

from ._native import Gateway as Gateway, GatewayError as GatewayError

__version__: str

_Path = Union[str, os.PathLike[str]]
# A worker URL, or a URL with its data-server (bootstrap) port.
_Worker = Union[str, tuple[str, int], tuple[str, str]]
_Workers = Union[str, Sequence[_Worker]]
_Strings = Union[str, Sequence[str]]
_Policy = Literal["round_robin", "random", "power_of_two", "least_load"]
_EncodePolicy = Literal["consistent_hashing", "round_robin", "random", "least_load"]

def to_argv(options: Mapping[str, Any]) -> list[str]: ...

class GatewayArgs:
    def __init__(
        self,
        *,
        model_path: _Path,
        host: str | None = None,
        port: int | None = None,
        chat_template: _Path | None = None,
        served_model_name: str | None = None,
        tokenizer_cache_entries: int | None = None,
        worker_urls: _Strings | None = None,
        pd_disaggregation: bool = False,
        prefill: _Workers | None = None,
        decode: _Strings | None = None,
        epd_disaggregation: bool = False,
        encode: _Workers | None = None,
        encode_policy: _EncodePolicy | None = None,
        encode_load_factor: float | None = None,
        encode_timeout_ms: int | None = None,
        encode_max_in_flight: int | None = None,
        policy: _Policy | None = None,
        prefill_policy: _Policy | None = None,
        decode_policy: _Policy | None = None,
        health_check_interval_secs: float | None = None,
        health_check_timeout_secs: float | None = None,
        health_failure_threshold: int | None = None,
        health_success_threshold: int | None = None,
        circuit_breaker_failures: int | None = None,
        max_retries: int | None = None,
        connect_timeout_ms: int | None = None,
        request_timeout_secs: int | None = None,
        shutdown_grace_secs: float | None = None,
        max_payload_size: int | None = None,
        mm_pixel_cache_mb: int | None = None,
        mm_per_request_image_limit: int | None = None,
        mm_allow_private_media_hosts: bool = False,
        mm_allowed_media_domains: _Strings | None = None,
        allowed_local_media_path: _Path | None = None,
        mm_max_image_bytes: int | None = None,
        mm_max_image_pixels: int | None = None,
        mm_fetch_connect_timeout_ms: int | None = None,
        mm_fetch_timeout_ms: int | None = None,
        mm_max_redirects: int | None = None,
        mm_encoder_input_dtype: Literal["float32", "bfloat16"] | None = None,
        # --multimodal-tensor-transport is being added to the gateway; until
        # it lands, passing it raises the CLI's "unexpected argument" error.
        multimodal_tensor_transport: str | None = None,
        service_discovery: bool = False,
        selector: _Strings | None = None,
        encode_selector: _Strings | None = None,
        prefill_selector: _Strings | None = None,
        decode_selector: _Strings | None = None,
        service_discovery_namespace: str | None = None,
        service_discovery_port: int | None = None,
        lws_leaders_only: bool = False,
        log_json: bool = False,
        **more: Any,
    ) -> None: ...
    @property
    def options(self) -> dict[str, Any]: ...
    def argv(self) -> list[str]: ...
    def replace(self, **changes: Any) -> GatewayArgs: ...

def launch_gateway(
    args: GatewayArgs | None = None,
    /,
    *,
    model_path: _Path = ...,
    host: str | None = None,
    port: int | None = None,
    chat_template: _Path | None = None,
    served_model_name: str | None = None,
    tokenizer_cache_entries: int | None = None,
    worker_urls: _Strings | None = None,
    pd_disaggregation: bool = False,
    prefill: _Workers | None = None,
    decode: _Strings | None = None,
    epd_disaggregation: bool = False,
    encode: _Workers | None = None,
    encode_policy: _EncodePolicy | None = None,
    encode_load_factor: float | None = None,
    encode_timeout_ms: int | None = None,
    encode_max_in_flight: int | None = None,
    policy: _Policy | None = None,
    prefill_policy: _Policy | None = None,
    decode_policy: _Policy | None = None,
    health_check_interval_secs: float | None = None,
    health_check_timeout_secs: float | None = None,
    health_failure_threshold: int | None = None,
    health_success_threshold: int | None = None,
    circuit_breaker_failures: int | None = None,
    max_retries: int | None = None,
    connect_timeout_ms: int | None = None,
    request_timeout_secs: int | None = None,
    shutdown_grace_secs: float | None = None,
    max_payload_size: int | None = None,
    mm_pixel_cache_mb: int | None = None,
    mm_per_request_image_limit: int | None = None,
    mm_allow_private_media_hosts: bool = False,
    mm_allowed_media_domains: _Strings | None = None,
    allowed_local_media_path: _Path | None = None,
    mm_max_image_bytes: int | None = None,
    mm_max_image_pixels: int | None = None,
    mm_fetch_connect_timeout_ms: int | None = None,
    mm_fetch_timeout_ms: int | None = None,
    mm_max_redirects: int | None = None,
    mm_encoder_input_dtype: Literal["float32", "bfloat16"] | None = None,
    multimodal_tensor_transport: str | None = None,
    service_discovery: bool = False,
    selector: _Strings | None = None,
    encode_selector: _Strings | None = None,
    prefill_selector: _Strings | None = None,
    decode_selector: _Strings | None = None,
    service_discovery_namespace: str | None = None,
    service_discovery_port: int | None = None,
    lws_leaders_only: bool = False,
    log_json: bool = False,
    **more: Any,
) -> Gateway: ...
