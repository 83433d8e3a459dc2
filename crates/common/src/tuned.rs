//! The best configuration a sweep found, kept per device, stage and shape (`ladder sweep
//! --save-best`), for later runs to use: the GPT-2 `fastest` plans apply the one saved at the
//! model's own shape of each op.
//!
//! One file per device: `tuned/<device uuid>.json` under the cache directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::variant::Variant;

/// The best point of one sweep.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tuned {
    pub family: String,
    pub op: String,
    pub stage: u32,
    /// The declared stage's name (not the sweep point's).
    pub name: String,
    pub shape: String,
    /// The tunables of the best point.
    pub config: Vec<(String, u32)>,
    pub median_ms: f64,
    /// The declared configuration's median in the same sweep.
    pub default_ms: Option<f64>,
}

impl Tuned {
    fn same_slot(&self, other: &Tuned) -> bool {
        (self.family.as_str(), self.op.as_str(), self.stage, self.shape.as_str())
            == (other.family.as_str(), other.op.as_str(), other.stage, other.shape.as_str())
    }

    /// `v` with this configuration's tunables (every one must be a tunable of `v`).
    pub fn apply(&self, v: &Variant) -> Result<Variant> {
        v.with_config(&self.config)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Store {
    entries: Vec<Tuned>,
}

/// The store's directory: `tuned/` under the cache directory.
pub fn dir() -> Result<PathBuf> {
    let base = crate::nvrtc::cache_dir()
        .ok_or_else(|| Error::constraint("a cache directory (LADDER_CACHE_DIR or HOME)", "none"))?;
    Ok(base.join("tuned"))
}

fn read(dir: &Path, uuid: &str) -> Result<Store> {
    let path = dir.join(format!("{uuid}.json"));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Io {
            context: format!("parsing {}", path.display()),
            source: std::io::Error::other(e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Store::default()),
        Err(source) => Err(Error::Io { context: format!("reading {}", path.display()), source }),
    }
}

/// Saves `entry` for device `uuid` in `dir` ([`dir`]), replacing the one of the same stage and
/// shape. Returns the file.
pub fn save(dir: &Path, uuid: &str, entry: Tuned) -> Result<PathBuf> {
    let mut store = read(dir, uuid)?;
    store.entries.retain(|e| !e.same_slot(&entry));
    store.entries.push(entry);
    let path = dir.join(format!("{uuid}.json"));
    let io = |source| Error::Io { context: format!("writing {}", path.display()), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, serde_json::to_vec_pretty(&store).unwrap_or_default()).map_err(io)?;
    Ok(path)
}

/// The configuration saved for stage `v` on device `uuid` at the first of `shapes` that has one.
pub fn lookup(dir: &Path, uuid: &str, v: &Variant, shapes: &[String]) -> Result<Option<Tuned>> {
    let store = read(dir, uuid)?;
    Ok(shapes.iter().find_map(|shape| {
        store
            .entries
            .iter()
            .find(|e| e.family == v.family && e.op == v.op && e.stage == v.stage && &e.shape == shape)
            .cloned()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::Precision;

    #[test]
    fn saved_configuration_is_found_at_its_shape_and_replaced_in_place() {
        let dir = std::env::temp_dir().join(format!("ladder-tuned-test-{}", std::process::id()));
        let dir = dir.as_path();
        let v = Variant::kernel("f", "op", 1, "vec", "op/01_vec.cu", Precision::Fp32, "s").with_tunables(&[("T", 256)]);
        let entry = |value, ms| Tuned {
            family: "f".into(),
            op: "op".into(),
            stage: 1,
            name: "vec".into(),
            shape: "N=10".into(),
            config: vec![("T".into(), value)],
            median_ms: ms,
            default_ms: Some(2.0),
        };
        save(dir, "dev", entry(64, 1.0)).unwrap();
        save(dir, "dev", entry(128, 0.9)).unwrap();
        assert_eq!(read(dir, "dev").unwrap().entries.len(), 1, "same stage and shape: replaced");
        let found = lookup(dir, "dev", &v, &["N=7".into(), "N=10".into()]).unwrap().unwrap();
        assert_eq!(found.apply(&v).unwrap().tunable("T").unwrap(), 128);
        assert!(lookup(dir, "dev", &v, &["N=7".into()]).unwrap().is_none());
        assert!(lookup(dir, "other", &v, &["N=10".into()]).unwrap().is_none());
        let mut foreign = entry(1, 1.0);
        foreign.config = vec![("NOPE".into(), 1)];
        assert!(foreign.apply(&v).is_err(), "a tunable the stage lacks is an error");
        let _ = std::fs::remove_dir_all(dir);
    }
}
