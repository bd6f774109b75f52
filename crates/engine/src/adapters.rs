//! The LoRA adapters an engine holds (SGLang's `LoadLoRAAdapter`,
//! `UnloadLoRAAdapter`, `ListLoadedLoRAAdapters`; requests name one by
//! `lora_id`).
//!
//! The reference engine has no weights to adapt: an adapter is a directory
//! holding an `adapter_config.json` (a JSON object, as PEFT writes it), and
//! what it changes is the token choice — its seed (the fingerprint of that
//! file's bytes, so the same adapter gives the same answers on every
//! worker) is mixed into every sequence's seed. At most `--max-loras`
//! adapters are loaded at once; a load over that is refused (the caller
//! unloads one first), never makes room by itself.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use tonic::Status;

/// The file an adapter directory must hold.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// One loaded adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    pub id: String,
    pub name: String,
    pub path: String,
    pub pinned: bool,
    /// Mixed into the seed of every sequence of its requests.
    pub seed: u64,
}

/// What a load asks for.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub id: String,
    pub name: String,
    pub path: String,
    pub pinned: bool,
}

/// The adapters loaded, in load order, at most `max` of them.
pub struct Adapters {
    max: usize,
    loaded: Mutex<Vec<Adapter>>,
}

impl Adapters {
    /// An empty store holding at most `max` adapters (0: none may load).
    pub fn new(max: usize) -> Adapters {
        Adapters {
            max,
            loaded: Mutex::new(Vec::new()),
        }
    }

    fn loaded(&self) -> MutexGuard<'_, Vec<Adapter>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads `request`'s adapter. Loading the same id under the same name
    /// again succeeds and changes nothing; an id or name already taken by
    /// another adapter, a directory without a readable JSON-object
    /// `adapter_config.json`, or one adapter more than the limit is
    /// refused with a status saying why.
    pub fn load(&self, request: LoadRequest) -> Result<(), Status> {
        check_names(&request.name, &request.id)?;
        let seed = read_seed(Path::new(&request.path))?;
        let mut loaded = self.loaded();
        if let Some(same) = loaded
            .iter()
            .find(|a| a.id == request.id || a.name == request.name)
        {
            return match same.id == request.id && same.name == request.name {
                true => Ok(()),
                false => Err(Status::already_exists(format!(
                    "LoRA adapter id {:?} / name {:?} is taken by the loaded adapter {:?} (id {:?})",
                    request.id, request.name, same.name, same.id
                ))),
            };
        }
        if loaded.len() >= self.max {
            return Err(Status::resource_exhausted(format!(
                "cannot load LoRA adapter {:?}: {} of --max-loras {} adapters are loaded; unload one first",
                request.name,
                loaded.len(),
                self.max
            )));
        }
        loaded.push(Adapter {
            id: request.id,
            name: request.name,
            path: request.path,
            pinned: request.pinned,
            seed,
        });
        Ok(())
    }

    /// Unloads the adapter named `name` (and, when `id` is not empty,
    /// loaded under `id`); NOT_FOUND when none is.
    pub fn unload(&self, name: &str, id: &str) -> Result<(), Status> {
        let mut loaded = self.loaded();
        let found = loaded
            .iter()
            .position(|a| (name.is_empty() || a.name == name) && (id.is_empty() || a.id == id));
        match found {
            Some(at) if !(name.is_empty() && id.is_empty()) => {
                loaded.remove(at);
                Ok(())
            }
            _ => Err(Status::not_found(format!(
                "no LoRA adapter named {name:?} (id {id:?}) is loaded"
            ))),
        }
    }

    /// The seed a request naming adapter `id` mixes in: 0 for the base
    /// model (`id` empty); NOT_FOUND for an adapter not loaded here.
    pub fn seed(&self, id: &str) -> Result<u64, Status> {
        Ok(self.find(id)?.map_or(0, |a| a.seed))
    }

    /// The adapter loaded under `id` (`None` for the base model, `id`
    /// empty); NOT_FOUND for an adapter not loaded here.
    pub fn find(&self, id: &str) -> Result<Option<Adapter>, Status> {
        if id.is_empty() {
            return Ok(None);
        }
        self.loaded()
            .iter()
            .find(|a| a.id == id)
            .map(|a| Some(a.clone()))
            .ok_or_else(|| {
                Status::not_found(format!(
                    "LoRA adapter {id:?} is not loaded on this worker (LoadLoRAAdapter it first)"
                ))
            })
    }

    /// The adapters loaded, in load order.
    pub fn list(&self) -> Vec<Adapter> {
        self.loaded().clone()
    }

    /// The ids of the adapters loaded, in load order.
    pub fn ids(&self) -> Vec<String> {
        self.loaded().iter().map(|a| a.id.clone()).collect()
    }
}

/// A load's name and id must both be given.
fn check_names(name: &str, id: &str) -> Result<(), Status> {
    match (name.is_empty(), id.is_empty()) {
        (true, _) => Err(Status::invalid_argument(
            "LoadLoRAAdapterRequest.lora_name is required",
        )),
        (_, true) => Err(Status::invalid_argument(
            "LoadLoRAAdapterRequest.lora_id is required (requests name the adapter by it)",
        )),
        _ => Ok(()),
    }
}

/// The seed of the adapter in `dir`: the fingerprint of its
/// `adapter_config.json`, which must be a JSON object.
fn read_seed(dir: &Path) -> Result<u64, Status> {
    let file = dir.join(ADAPTER_CONFIG);
    let bytes = std::fs::read(&file).map_err(|e| {
        Status::failed_precondition(format!(
            "cannot read the LoRA adapter's {}: {e}",
            file.display()
        ))
    })?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => {
            return Err(Status::failed_precondition(format!(
                "{} is not a JSON object",
                file.display()
            )))
        }
        Err(e) => {
            return Err(Status::failed_precondition(format!(
                "{} is not JSON: {e}",
                file.display()
            )))
        }
    }
    let print = iris_fingerprint::fingerprint(&bytes);
    let mut head = [0u8; 8];
    head.copy_from_slice(&print[..8]);
    // Never 0, which is the base model's.
    Ok(u64::from_le_bytes(head) | 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter_dir(config: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ADAPTER_CONFIG), config).unwrap();
        dir
    }

    fn request(name: &str, dir: &tempfile::TempDir) -> LoadRequest {
        LoadRequest {
            id: format!("{name}-id"),
            name: name.into(),
            path: dir.path().display().to_string(),
            pinned: false,
        }
    }

    #[test]
    fn loads_lists_and_unloads() {
        let (a, b) = (adapter_dir(r#"{"r": 8}"#), adapter_dir(r#"{"r": 16}"#));
        let store = Adapters::new(4);
        store.load(request("a", &a)).unwrap();
        store.load(request("b", &b)).unwrap();
        store.load(request("a", &a)).unwrap();
        assert_eq!(store.ids(), ["a-id", "b-id"]);
        let (sa, sb) = (store.seed("a-id").unwrap(), store.seed("b-id").unwrap());
        assert!(sa != sb && sa != 0 && sb != 0);
        assert_eq!(store.seed("").unwrap(), 0);
        store.unload("a", "").unwrap();
        assert_eq!(store.ids(), ["b-id"]);
        let err = store.seed("a-id").unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(err.message().contains("not loaded"), "{}", err.message());
        assert_eq!(
            store.unload("a", "").unwrap_err().code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            store.unload("", "").unwrap_err().code(),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn the_limit_refuses_one_more() {
        let (a, b) = (adapter_dir("{}"), adapter_dir(r#"{"x": 1}"#));
        let store = Adapters::new(1);
        store.load(request("a", &a)).unwrap();
        let err = store.load(request("b", &b)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("--max-loras 1"), "{}", err.message());
        store.unload("a", "a-id").unwrap();
        store.load(request("b", &b)).unwrap();
    }

    #[test]
    fn bad_directories_and_names_are_refused() {
        let store = Adapters::new(4);
        let empty = tempfile::tempdir().unwrap();
        let err = store.load(request("a", &empty)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains(ADAPTER_CONFIG), "{}", err.message());
        let list = adapter_dir("[1]");
        assert!(store.load(request("a", &list)).is_err());
        let good = adapter_dir("{}");
        let mut nameless = request("", &good);
        nameless.id = "x".into();
        assert_eq!(
            store.load(nameless).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        store.load(request("a", &good)).unwrap();
        let mut clash = request("a", &good);
        clash.id = "other".into();
        assert_eq!(
            store.load(clash).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
    }

    #[test]
    fn the_same_file_gives_the_same_seed() {
        let (a, b) = (adapter_dir(r#"{"r": 8}"#), adapter_dir(r#"{"r": 8}"#));
        let (one, two) = (Adapters::new(1), Adapters::new(1));
        one.load(request("a", &a)).unwrap();
        two.load(request("b", &b)).unwrap();
        assert_eq!(one.seed("a-id").unwrap(), two.seed("b-id").unwrap());
    }
}
