//! `sglang_sidecar_overlay._native`: the Python face of [`crate::server`].
//!
//! Every blocking call releases the GIL, and the server threads never take it, so a busy
//! SGLang process and the metadata server do not slow each other down.

use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use crate::address::parse_bind_address;
use crate::limits::{self, Limits};
use crate::server::{MetadataServer, ServerOptions, StartError};
use crate::service::Implementation;

/// A running follower metadata server (GetServerInfo + grpc.health.v1, and reflection).
#[pyclass(
    name = "MetadataServer",
    module = "sglang_sidecar_overlay._native",
    frozen
)]
struct PyMetadataServer {
    server: MetadataServer,
    #[pyo3(get)]
    host: String,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl PyMetadataServer {
    /// True while the server thread runs.
    fn is_alive(&self) -> bool {
        self.server.is_alive()
    }

    /// Report SERVING (True) or NOT_SERVING (False) through grpc.health.v1.
    fn set_serving(&self, py: Python<'_>, serving: bool) {
        py.detach(|| self.server.set_serving(serving));
    }

    /// Stop serving and wait for the server thread; idempotent, safe from any thread.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.server.shutdown());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc_info))]
    fn __exit__(&self, py: Python<'_>, _exc_info: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.shutdown(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "MetadataServer(host={:?}, port={}, alive={})",
            self.host,
            self.port,
            self.server.is_alive()
        )
    }
}

/// Start a follower metadata server bound to (host, port) that answers GetServerInfo with
/// `server_info_json`. Binding happens before this returns; port 0 picks a free port.
/// The keyword-only limits are documented in `_native.pyi`; their defaults are
/// `DEFAULT_LIMITS`, and a bad value raises ValueError naming it.
#[pyfunction]
#[pyo3(signature = (
    host,
    port,
    server_info_json,
    *,
    max_connections = None,
    handshake_timeout_s = None,
    max_request_bytes = None,
    max_message_bytes = None,
    max_concurrent_streams = None,
    max_header_list_bytes = None,
    request_timeout_s = None,
    keepalive_interval_s = None,
    keepalive_timeout_s = None,
    tcp_keepalive_s = None,
    implementation = None,
    reflection = None,
))]
#[allow(clippy::too_many_arguments)]
fn start_metadata_server(
    py: Python<'_>,
    host: &str,
    port: i64,
    server_info_json: String,
    max_connections: Option<Bound<'_, PyAny>>,
    handshake_timeout_s: Option<Bound<'_, PyAny>>,
    max_request_bytes: Option<Bound<'_, PyAny>>,
    max_message_bytes: Option<Bound<'_, PyAny>>,
    max_concurrent_streams: Option<Bound<'_, PyAny>>,
    max_header_list_bytes: Option<Bound<'_, PyAny>>,
    request_timeout_s: Option<Bound<'_, PyAny>>,
    keepalive_interval_s: Option<Bound<'_, PyAny>>,
    keepalive_timeout_s: Option<Bound<'_, PyAny>>,
    tcp_keepalive_s: Option<Bound<'_, PyAny>>,
    implementation: Option<Bound<'_, PyAny>>,
    reflection: Option<Bound<'_, PyAny>>,
) -> PyResult<PyMetadataServer> {
    let addr =
        parse_bind_address(host, port).map_err(|err| PyValueError::new_err(err.to_string()))?;
    let mut l = Limits::default();
    l.max_connections = count_arg("max_connections", max_connections, l.max_connections)?;
    l.handshake_timeout = seconds_arg(
        "handshake_timeout_s",
        handshake_timeout_s,
        l.handshake_timeout,
    )?;
    l.max_request_bytes = count_arg("max_request_bytes", max_request_bytes, l.max_request_bytes)?;
    l.max_message_bytes = count_arg("max_message_bytes", max_message_bytes, l.max_message_bytes)?;
    l.max_concurrent_streams = count_arg(
        "max_concurrent_streams",
        max_concurrent_streams,
        l.max_concurrent_streams as usize,
    )? as u32;
    l.max_header_list_bytes = count_arg(
        "max_header_list_bytes",
        max_header_list_bytes,
        l.max_header_list_bytes as usize,
    )? as u32;
    l.request_timeout = seconds_arg("request_timeout_s", request_timeout_s, l.request_timeout)?;
    l.keepalive_interval = seconds_arg(
        "keepalive_interval_s",
        keepalive_interval_s,
        l.keepalive_interval,
    )?;
    l.keepalive_timeout = seconds_arg(
        "keepalive_timeout_s",
        keepalive_timeout_s,
        l.keepalive_timeout,
    )?;
    l.tcp_keepalive = seconds_arg("tcp_keepalive_s", tcp_keepalive_s, l.tcp_keepalive)?;
    let implementation = match implementation {
        None => Implementation::default(),
        Some(value) => value
            .extract::<String>()
            .ok()
            .and_then(|name| Implementation::parse(&name))
            .ok_or_else(|| {
                bad_value("implementation", &value, "expected 'framed' or 'generated'")
            })?,
    };
    let reflection = match reflection {
        None => ServerOptions::default().reflection,
        Some(value) if value.is_instance_of::<PyBool>() => value.is_truthy()?,
        Some(value) => return Err(bad_value("reflection", &value, "expected True or False")),
    };
    let options = ServerOptions {
        limits: l,
        implementation,
        reflection,
        ..ServerOptions::default()
    };
    let server = py
        .detach(|| MetadataServer::start(addr, server_info_json, &options))
        .map_err(start_error_to_py)?;
    let bound = server.local_addr();
    Ok(PyMetadataServer {
        host: bound.ip().to_string(),
        port: bound.port(),
        server,
    })
}

/// An integer limit; anything else (a float, a bool, a string, out of range) is a ValueError
/// that names the keyword and shows the value as Python would.
fn count_arg(
    name: &'static str,
    value: Option<Bound<'_, PyAny>>,
    default: usize,
) -> PyResult<usize> {
    let Some(value) = value else {
        return Ok(default);
    };
    let parsed = if value.is_instance_of::<PyBool>() {
        None
    } else {
        value.extract::<i64>().ok()
    };
    match parsed {
        Some(number) => {
            limits::count(name, number).map_err(|err| bad_value(name, &value, err.expected))
        }
        None => Err(bad_value(
            name,
            &value,
            "expected an integer from 1 to 1073741824",
        )),
    }
}

/// A duration in seconds (int or float).
fn seconds_arg(
    name: &'static str,
    value: Option<Bound<'_, PyAny>>,
    default: Duration,
) -> PyResult<Duration> {
    let Some(value) = value else {
        return Ok(default);
    };
    let parsed = if value.is_instance_of::<PyBool>() {
        None
    } else {
        value.extract::<f64>().ok()
    };
    match parsed {
        Some(seconds) => {
            limits::seconds(name, seconds).map_err(|err| bad_value(name, &value, err.expected))
        }
        None => Err(bad_value(
            name,
            &value,
            "expected seconds above 0 and at most 86400",
        )),
    }
}

fn bad_value(name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyErr {
    let shown = value
        .repr()
        .map(|repr| repr.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    PyValueError::new_err(format!("{name}={shown} is invalid: {expected}"))
}

fn start_error_to_py(err: StartError) -> PyErr {
    let message = err.to_string();
    match err {
        StartError::InvalidJson(_) => PyValueError::new_err(message),
        StartError::Bind { source, .. } | StartError::Runtime(source) => {
            match source.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, message)),
                None => PyOSError::new_err(message),
            }
        }
    }
}

/// Versions and build settings, for `sglang-sidecar-overlay status`.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = PyDict::new(py);
    info.set_item("version", env!("CARGO_PKG_VERSION"))?;
    info.set_item("profile", env!("OVERLAY_BUILD_PROFILE"))?;
    info.set_item("target", env!("OVERLAY_BUILD_TARGET"))?;
    info.set_item(
        "grpc",
        "tonic 0.14, tonic-health 0.14, tonic-reflection 0.14, prost 0.14",
    )?;
    info.set_item(
        "services",
        vec![
            crate::SGLANG_SERVICE,
            tonic_health::pb::health_server::SERVICE_NAME,
        ],
    )?;
    info.set_item(
        "reflection",
        crate::reflection::REFLECTION_SERVICES.to_vec(),
    )?;
    Ok(info)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let defaults = PyDict::new(m.py());
    for (name, value) in Limits::default().as_pairs() {
        if name.ends_with("_s") {
            defaults.set_item(name, value)?;
        } else {
            defaults.set_item(name, value as u64)?;
        }
    }
    m.add("DEFAULT_LIMITS", defaults)?;
    m.add(
        "MAX_REFLECTION_REQUESTS",
        crate::reflection::MAX_REQUESTS_PER_STREAM,
    )?;
    m.add("MAX_REFLECTION_STREAMS", crate::reflection::MAX_STREAMS)?;
    m.add_class::<PyMetadataServer>()?;
    m.add_function(wrap_pyfunction!(start_metadata_server, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    Ok(())
}
