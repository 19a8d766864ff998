//! `sglang_sidecar_overlay._native`: the Python face of [`crate::server`].
//!
//! Every blocking call releases the GIL, and the server threads never take it, so a busy
//! SGLang process and the metadata server do not slow each other down.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::address::parse_bind_address;
use crate::server::{MetadataServer, ServerOptions, StartError};

/// A running follower metadata server (GetServerInfo + grpc.health.v1).
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
#[pyfunction]
fn start_metadata_server(
    py: Python<'_>,
    host: &str,
    port: i64,
    server_info_json: String,
) -> PyResult<PyMetadataServer> {
    let addr =
        parse_bind_address(host, port).map_err(|err| PyValueError::new_err(err.to_string()))?;
    let server = py
        .detach(|| MetadataServer::start(addr, server_info_json, &ServerOptions::default()))
        .map_err(start_error_to_py)?;
    let bound = server.local_addr();
    Ok(PyMetadataServer {
        host: bound.ip().to_string(),
        port: bound.port(),
        server,
    })
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
    info.set_item("grpc", "tonic 0.14, tonic-health 0.14, prost 0.14")?;
    info.set_item(
        "services",
        vec![crate::SGLANG_SERVICE, "grpc.health.v1.Health"],
    )?;
    Ok(info)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyMetadataServer>()?;
    m.add_function(wrap_pyfunction!(start_metadata_server, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    Ok(())
}
