use cudarc::driver::DriverError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the harness can report. Each one prints as a single line except `Compile`, which
/// carries NVRTC's full log after its first line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("no CUDA device {index}: {reason}")]
    NoDevice { index: usize, reason: String },
    #[error("CUDA driver too old: it supports CUDA {found}, these bindings need {required}")]
    DriverTooOld { found: String, required: String },
    #[error("NVRTC is not available: {0}")]
    NoNvrtc(String),
    #[error("CUDA headers (cuda_fp16.h) not found; looked in: {0}")]
    NoCudaHeaders(String),
    /// The first attempt's `NoNvrtc` or `NoCudaHeaders`, as text (the toolchain is located once).
    #[error("{0}")]
    Toolchain(String),
    #[error("compiling {variant} for {arch} failed; NVRTC log:\n{log}")]
    Compile { variant: String, arch: String, log: String },
    /// NVRTC compiled the program but its log holds no ptxas report of an entry point.
    #[error(
        "compiling {variant} for {arch} with NVRTC {nvrtc}: no ptxas report of any entry point (options: \
         {options}); its log:\n{log}"
    )]
    NoPtxasReport { variant: String, arch: String, nvrtc: String, options: String, log: String },
    #[error("kernel source {0} is not embedded in this family")]
    MissingSource(String),
    #[error("constraint violated: {constraint} (got {got})")]
    Constraint { constraint: String, got: String },
    #[error("invalid launch of {kernel}: {reason}")]
    Launch { kernel: String, reason: String },
    #[error("unknown {what} '{name}'; known: {known}")]
    Unknown { what: &'static str, name: String, known: String },
    #[error("bad shape '{0}': expected key=value pairs separated by commas")]
    ShapeSyntax(String),
    #[error("shape value {key}={value} does not fit a 64-bit integer")]
    ShapeValue { key: String, value: String },
    #[error("shape value {key}={value} is not an integer")]
    ShapeNotInteger { key: String, value: String },
    #[error("shape key {key} given twice in '{text}'")]
    ShapeKeyRepeated { key: String, text: String },
    #[error("no stage prepared: call prepare before enqueue or verify")]
    NotPrepared,
    #[error("graph capture failed: {0}")]
    Capture(String),
    #[error("{variant} needs compute capability {needed}, device has {found}")]
    Unsupported { variant: String, needed: String, found: String },
    #[error("CUDA error in {context}: {source}")]
    Driver { context: String, source: DriverError },
    #[error("cuBLAS error in {context}: {message}")]
    Blas { context: String, message: String },
    #[error("verification failed: {0}")]
    Verification(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

impl Error {
    /// A violated constraint on a shape, length, alignment or limit: `constraint` says what must
    /// hold ("C % 4 == 0"), `got` what was given ("C = 770").
    pub fn constraint(constraint: impl Into<String>, got: impl Into<String>) -> Self {
        Error::Constraint { constraint: constraint.into(), got: got.into() }
    }
}

impl Error {
    /// Whether the error says a stage does not apply (a violated shape constraint or a device
    /// requirement) rather than that something went wrong: the table shows such a stage as `n/a`.
    pub fn is_not_applicable(&self) -> bool {
        matches!(self, Error::Constraint { .. } | Error::Unsupported { .. })
    }
}

/// Attach a context string to a driver call's error.
pub trait DriverContext<T> {
    fn ctx(self, context: &str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn ctx(self, context: &str) -> Result<T> {
        self.map_err(|source| Error::Driver { context: context.to_string(), source })
    }
}

/// Fail with a [`Error::Constraint`] unless `ok`.
pub fn require(ok: bool, constraint: &str, got: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::constraint(constraint, got()))
    }
}

/// `len(name) == want` as a typed constraint.
pub fn require_len(name: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::constraint(format!("len({name}) == {want}"), format!("len({name}) = {len}")))
    }
}
