//! `sglang_sidecar_overlay._native`: the Python face of [`crate::server`].
//!
//! Every blocking call releases the GIL, and the server threads never take it, so a busy
//! SGLang process and the metadata server do not slow each other down.

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use crate::address::parse_bind_address;
use crate::limits::{Kind, Limit, Limits};
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
    /// False once the server has stopped; waits for a stop in progress to finish.
    fn is_alive(&self, py: Python<'_>) -> bool {
        py.detach(|| self.server.is_alive())
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
/// The keyword-only limits are the rows of `crate::limits::LIMITS`, documented in
/// `_native.pyi`; their defaults are `DEFAULT_LIMITS`, and a bad value raises ValueError
/// naming it.
#[pyfunction]
#[pyo3(
    signature = (host, port, server_info_json, *, implementation = None, reflection = None, **limits),
    text_signature = "(host, port, server_info_json, *, implementation='framed', reflection=True, **limits)"
)]
fn start_metadata_server(
    py: Python<'_>,
    host: &str,
    port: i64,
    server_info_json: String,
    implementation: Option<Bound<'_, PyAny>>,
    reflection: Option<Bound<'_, PyAny>>,
    limits: Option<Bound<'_, PyDict>>,
) -> PyResult<PyMetadataServer> {
    let addr =
        parse_bind_address(host, port).map_err(|err| PyValueError::new_err(err.to_string()))?;
    let limits = limits_arg(limits)?;
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
        limits,
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

/// The defaults with every limit keyword given applied. An unknown keyword is a TypeError, as
/// Python raises for any function; a value of the wrong kind or out of range is a ValueError
/// that names the keyword and shows the value as Python would. None leaves the default.
fn limits_arg(given: Option<Bound<'_, PyDict>>) -> PyResult<Limits> {
    let mut limits = Limits::default();
    let Some(given) = given else {
        return Ok(limits);
    };
    for (key, value) in given.iter() {
        let keyword = key.extract::<String>()?;
        let limit = Limit::named(&keyword).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "start_metadata_server() got an unexpected keyword argument '{keyword}'"
            ))
        })?;
        if value.is_none() {
            continue;
        }
        let expected = limit.kind.expected();
        let number = if value.is_instance_of::<PyBool>() {
            None
        } else {
            match limit.kind {
                Kind::Count => value.extract::<i64>().ok().map(|n| n as f64),
                Kind::Seconds => value.extract::<f64>().ok(),
            }
        };
        let number = number.ok_or_else(|| bad_value(limit.keyword, &value, expected))?;
        limit
            .set(&mut limits, number)
            .map_err(|err| bad_value(limit.keyword, &value, err.expected))?;
    }
    Ok(limits)
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
    // The gRPC crates this module was built with, read from Cargo.lock by build.rs.
    info.set_item("grpc", env!("OVERLAY_GRPC_CRATES"))?;
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
    for (limit, value) in Limits::default().as_pairs() {
        match limit.kind {
            Kind::Seconds => defaults.set_item(limit.keyword, value)?,
            Kind::Count => defaults.set_item(limit.keyword, value as u64)?,
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
