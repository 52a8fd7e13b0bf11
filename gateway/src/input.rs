//! What `-f` reads, for `apply`, `import` and `expand`: a file, standard input (`-`) or a
//! directory (its `.yaml`, `.yml` and `.json` files in name order, subdirectories with
//! `-R`), each a YAML/JSON stream of documents, and a `List` document (what `get -o yaml`
//! prints for a list) standing for its items, as kubectl reads them; `-f` given several times,
//! each input in turn. Each object becomes a [`Unit`] that knows where it came from, so an
//! error about it can say so. [`dependency_order`] is the order `apply` sends them in.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The file extensions a directory's manifests have (kubectl's).
pub const MANIFEST_EXTENSIONS: [&str; 3] = ["json", "yaml", "yml"];

/// Why `-f` could not be read. Each names the input and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Standard input could not be read. (The cause is in the message, not a `source`: the
    /// binary prints an error's whole chain, which would say it twice.)
    #[error("-f -: cannot read standard input: {0}")]
    Stdin(std::io::Error),
    /// A file or directory could not be read.
    #[error("-f {path}: cannot read: {error}")]
    Read {
        /// The path, as given or as found in a directory.
        path: String,
        /// Why (in the message, not a `source`, as for `Stdin`).
        error: std::io::Error,
    },
    /// A directory without any manifest file.
    #[error(
        "-f {dir}: no .yaml, .yml or .json file in the directory{hint}; name a file or a \
         directory that holds manifests"
    )]
    NoManifestFiles {
        /// The directory.
        dir: String,
        /// `` (pass -R …)`` when it has subdirectories that were not read.
        hint: &'static str,
    },
    /// A document that is not YAML/JSON.
    #[error("-f {place}: {message}")]
    Syntax {
        /// `FILE: document N`.
        place: String,
        /// The parser's message.
        message: String,
    },
    /// A `List` whose `items` is not a list of objects.
    #[error(
        "-f {place}: items: a List needs an items array (apiVersion: v1, kind: List, items: [...])"
    )]
    ListItems {
        /// `FILE: document N`.
        place: String,
    },
    /// Nothing to send.
    #[error("-f {file}: no objects found")]
    NoObjects {
        /// The input (the inputs, `a.yaml -f b.yaml`, when `-f` was given several times).
        file: String,
    },
    /// `-f -` given more than once: standard input can be read only once.
    #[error("-f - is given more than once: standard input can be read only once; give -f - once")]
    StdinTwice,
}

/// One object read from `-f`, as the JSON the server parses, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// Where in the input: `document 2`, `document 1: items[3]`, `dir/a.yaml: document 1`.
    pub place: String,
    /// Whether an error about it must say where it is even when it names its object: the
    /// input held several objects (or a list, or a directory).
    pub among_others: bool,
    /// The document (or list item).
    pub value: serde_json::Value,
}

impl Unit {
    /// The object as JSON text.
    #[must_use]
    pub fn json(&self) -> String {
        self.value.to_string()
    }
}

/// Reads `-f FILE|DIR|-` into the objects it holds, in order.
pub fn read(file: &str, recursive: bool) -> Result<Vec<Unit>, InputError> {
    let (mut units, from_dir) = read_input(file, recursive)?;
    if units.is_empty() {
        return Err(InputError::NoObjects {
            file: file.to_string(),
        });
    }
    let among_others = from_dir || units.len() > 1;
    for unit in &mut units {
        unit.among_others |= among_others;
    }
    Ok(units)
}

/// Reads every `-f` given, in the order given, into the objects they hold: one input as
/// [`read`] reads it; with several, each object's place starts with its input's name
/// (`a.yaml: document 2`; a directory's already name their file), and an input without objects
/// is no error as long as another has some (kubectl's rule).
pub fn read_all(files: &[String], recursive: bool) -> Result<Vec<Unit>, InputError> {
    if let [file] = files {
        return read(file, recursive);
    }
    if files.iter().filter(|f| *f == "-").count() > 1 {
        return Err(InputError::StdinTwice);
    }
    let mut units = Vec::new();
    for file in files {
        let (read, from_dir) = read_input(file, recursive)?;
        units.extend(read.into_iter().map(|mut unit| {
            if !from_dir {
                unit.place = format!("{file}: {}", unit.place);
            }
            unit.among_others = true;
            unit
        }));
    }
    if units.is_empty() {
        return Err(InputError::NoObjects {
            file: files.join(" -f "),
        });
    }
    Ok(units)
}

/// The class of objects `apply` sends together, in the order the classes are sent: what an
/// object of a class refers to is of an earlier class (a VM captures its instancetype's and
/// preference's revision when it is created, so they must exist first; a snapshot is of a VM;
/// a restore, of a snapshot; a clone, of a VM or a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ApplyClass {
    /// The cluster configuration (`KubeVirt`): the features everything else may use.
    ClusterConfig,
    /// Instancetypes and preferences, namespaced and cluster-wide.
    InstancetypesAndPreferences,
    /// VMs and VMIs (and the kinds vmplane parses but does not manage: pools, replica sets,
    /// migrations, which the server refuses).
    Workloads,
    /// `VirtualMachineSnapshot`.
    Snapshots,
    /// `VirtualMachineRestore`.
    Restores,
    /// `VirtualMachineClone`.
    Clones,
    /// A document whose `kind` vmplane does not know (or that has none): last, as the server
    /// refuses it anyway.
    Unknown,
}

impl ApplyClass {
    /// The class of an object by its `kind`.
    #[must_use]
    pub fn of(value: &serde_json::Value) -> ApplyClass {
        use vmplane_core::types::Kind;
        let kind = value
            .get("kind")
            .and_then(serde_json::Value::as_str)
            .and_then(|k| Kind::ALL.into_iter().find(|known| known.as_str() == k));
        match kind {
            None => ApplyClass::Unknown,
            Some(Kind::KubeVirt) => ApplyClass::ClusterConfig,
            Some(
                Kind::VirtualMachineInstancetype
                | Kind::VirtualMachineClusterInstancetype
                | Kind::VirtualMachinePreference
                | Kind::VirtualMachineClusterPreference,
            ) => ApplyClass::InstancetypesAndPreferences,
            Some(
                Kind::VirtualMachine
                | Kind::VirtualMachineInstance
                | Kind::VirtualMachinePool
                | Kind::VirtualMachineInstanceReplicaSet
                | Kind::VirtualMachineInstanceMigration,
            ) => ApplyClass::Workloads,
            Some(Kind::VirtualMachineSnapshot) => ApplyClass::Snapshots,
            Some(Kind::VirtualMachineRestore) => ApplyClass::Restores,
            Some(Kind::VirtualMachineClone) => ApplyClass::Clones,
        }
    }
}

/// Puts `units` in the order `apply` sends them: by [`ApplyClass`], each class in the input's
/// order (a stable sort), so that a VM written before its instancetype in a file, or in a file
/// that sorts before the instancetype's, is created after it, as kubectl with KubeVirt creates
/// it. Each unit keeps its place in the input for its messages.
pub fn dependency_order(units: &mut [Unit]) {
    units.sort_by_key(|unit| ApplyClass::of(&unit.value));
}

/// The objects of one `-f` input in order, and whether it was a directory; no object is no
/// error here.
fn read_input(file: &str, recursive: bool) -> Result<(Vec<Unit>, bool), InputError> {
    let mut sources = Vec::new();
    let from_dir;
    if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(InputError::Stdin)?;
        sources.push((None, text));
        from_dir = false;
    } else {
        let path = Path::new(file);
        let read_err = |path: &Path, error| InputError::Read {
            path: path.display().to_string(),
            error,
        };
        from_dir = std::fs::metadata(path)
            .map_err(|e| read_err(path, e))?
            .is_dir();
        if from_dir {
            let mut files = Vec::new();
            let mut skipped_dirs = false;
            manifest_files(path, recursive, &mut files, &mut skipped_dirs)?;
            if files.is_empty() {
                return Err(InputError::NoManifestFiles {
                    dir: file.to_string(),
                    hint: if skipped_dirs {
                        " (pass -R to read its subdirectories too)"
                    } else {
                        ""
                    },
                });
            }
            for f in files {
                let text = std::fs::read_to_string(&f).map_err(|e| read_err(&f, e))?;
                sources.push((Some(f.display().to_string()), text));
            }
        } else {
            let text = std::fs::read_to_string(path).map_err(|e| read_err(path, e))?;
            sources.push((None, text));
        }
    }
    let mut units = Vec::new();
    for (name, text) in &sources {
        documents(name.as_deref(), file, text, &mut units)?;
    }
    Ok((units, from_dir))
}

/// The manifest files of `dir` in name order, with its subdirectories' (in their place in
/// that order) when `recursive`; `skipped_dirs` says whether any subdirectory was left out.
fn manifest_files(
    dir: &Path,
    recursive: bool,
    files: &mut Vec<PathBuf>,
    skipped_dirs: &mut bool,
) -> Result<(), InputError> {
    let read_err = |error| InputError::Read {
        path: dir.display().to_string(),
        error,
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if recursive {
                manifest_files(&path, recursive, files, skipped_dirs)?;
            } else {
                *skipped_dirs = true;
            }
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| MANIFEST_EXTENSIONS.contains(&e))
        {
            files.push(path);
        }
    }
    Ok(())
}

/// Whether `value` is a list document: `kind: List` (or `<Kind>List`) with `items`.
fn is_list(value: &serde_json::Value) -> bool {
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    kind == "List" || (kind.ends_with("List") && value.get("items").is_some())
}

/// Appends the objects of one file's text (`name` when it came from a directory) to `units`.
fn documents(
    name: Option<&str>,
    file: &str,
    text: &str,
    units: &mut Vec<Unit>,
) -> Result<(), InputError> {
    let place_of = |number: usize| match name {
        Some(name) => format!("{name}: document {number}"),
        None => format!("document {number}"),
    };
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value: serde_json::Value =
            serde::Deserialize::deserialize(de).map_err(|e| InputError::Syntax {
                place: in_input(place_of(i + 1), file, name),
                message: e.to_string(),
            })?;
        if value.is_null() {
            continue; // an empty document (e.g. a trailing `---`)
        }
        items(place_of(i + 1), value, false, file, name, units)?;
    }
    Ok(())
}

/// Appends `value` to `units`, or, for a list, its items (a list in a list too); `listed`
/// when `value` is itself an item of a list.
fn items(
    place: String,
    mut value: serde_json::Value,
    listed: bool,
    file: &str,
    name: Option<&str>,
    units: &mut Vec<Unit>,
) -> Result<(), InputError> {
    if !is_list(&value) {
        units.push(Unit {
            place,
            among_others: listed,
            value,
        });
        return Ok(());
    }
    let listed_items = match value.get_mut("items").map(serde_json::Value::take) {
        Some(serde_json::Value::Array(list)) => list,
        // `items: null` or none at all: an empty list.
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(_) => {
            return Err(InputError::ListItems {
                place: in_input(place, file, name),
            });
        }
    };
    for (j, item) in listed_items.into_iter().enumerate() {
        if !item.is_null() {
            items(
                format!("{place}: items[{j}]"),
                item,
                true,
                file,
                name,
                units,
            )?;
        }
    }
    Ok(())
}

/// `place` as an error names it: a directory's places start with their file's path already,
/// else the input (`-f`'s value) goes first.
fn in_input(place: String, file: &str, name: Option<&str>) -> String {
    match name {
        Some(_) => place,
        None => format!("{file}: {place}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(units: &[Unit]) -> Vec<(&str, &str)> {
        units
            .iter()
            .map(|u| {
                (
                    u.place.as_str(),
                    u.value["metadata"]["name"].as_str().unwrap_or(""),
                )
            })
            .collect()
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).expect("write");
    }

    const LIST: &str = "apiVersion: v1
kind: List
items:
- apiVersion: kubevirt.io/v1
  kind: VirtualMachine
  metadata: {name: a, resourceVersion: \"7\"}
  status: {printableStatus: Stopped}
- apiVersion: kubevirt.io/v1
  kind: VirtualMachine
  metadata: {name: b}
metadata:
  resourceVersion: \"9\"
";

    #[test]
    fn a_list_document_stands_for_its_items_in_order_each_placed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vm = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: c}\n";
        write(dir.path(), "x.yaml", &format!("{LIST}---\n{vm}"));
        let path = dir.path().join("x.yaml");
        let units = read(path.to_str().expect("utf-8"), false).expect("read");
        assert_eq!(
            places(&units),
            [
                ("document 1: items[0]", "a"),
                ("document 1: items[1]", "b"),
                ("document 2", "c"),
            ]
        );
        assert!(units.iter().all(|u| u.among_others));
        // The item is sent as it was listed (the server ignores status and resourceVersion).
        assert_eq!(units[0].value["status"]["printableStatus"], "Stopped");
        // An empty list, as `get -o yaml` prints one, holds no objects.
        write(
            dir.path(),
            "empty.yaml",
            "apiVersion: v1\nkind: List\nitems: []\n",
        );
        let empty = dir.path().join("empty.yaml");
        let err = read(empty.to_str().expect("utf-8"), false).expect_err("empty");
        assert!(matches!(err, InputError::NoObjects { .. }), "{err}");
        write(
            dir.path(),
            "bad.yaml",
            "apiVersion: v1\nkind: List\nitems: 3\n",
        );
        let bad = dir.path().join("bad.yaml");
        let err = read(bad.to_str().expect("utf-8"), false).expect_err("bad items");
        assert!(err.to_string().contains("document 1: items:"), "{err}");
    }

    #[test]
    fn a_directory_is_read_file_by_file_in_name_order_and_subdirectories_only_with_r() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vm = |name: &str| {
            format!(
                "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\n"
            )
        };
        write(dir.path(), "b.yml", &vm("b"));
        write(
            dir.path(),
            "a.yaml",
            &format!("{}---\n{}", vm("a1"), vm("a2")),
        );
        write(
            dir.path(),
            "c.json",
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"c"}}"#,
        );
        write(dir.path(), "README.md", "not a manifest");
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        write(&dir.path().join("d"), "e.yaml", &vm("e"));
        let root = dir.path().to_str().expect("utf-8");
        let names = |units: &[Unit]| -> Vec<String> {
            places(units).iter().map(|(_, n)| n.to_string()).collect()
        };
        let units = read(root, false).expect("read");
        assert_eq!(names(&units), ["a1", "a2", "b", "c"]);
        assert_eq!(units[1].place, format!("{root}/a.yaml: document 2"));
        assert!(units.iter().all(|u| u.among_others));
        assert_eq!(
            names(&read(root, true).expect("read")),
            ["a1", "a2", "b", "c", "e"]
        );

        let empty = tempfile::tempdir().expect("tempdir");
        let err = read(empty.path().to_str().expect("utf-8"), false).expect_err("empty");
        assert!(matches!(err, InputError::NoManifestFiles { .. }), "{err}");
        assert!(!err.to_string().contains('\n'), "{err}");
        std::fs::create_dir(empty.path().join("sub")).expect("mkdir");
        let err = read(empty.path().to_str().expect("utf-8"), false).expect_err("empty");
        assert!(err.to_string().contains("-R"), "{err}");
    }

    #[test]
    fn one_plain_object_is_not_among_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "one.yaml",
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: a}\n---\n",
        );
        let units =
            read(dir.path().join("one.yaml").to_str().expect("utf-8"), false).expect("read");
        assert_eq!(places(&units), [("document 1", "a")]);
        assert!(!units[0].among_others);
    }

    #[test]
    fn several_inputs_are_read_in_turn_each_place_naming_its_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vm = |name: &str| {
            format!(
                "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\n"
            )
        };
        write(
            dir.path(),
            "b.yaml",
            &format!("{}---\n{}", vm("b1"), vm("b2")),
        );
        write(dir.path(), "empty.yaml", "---\n");
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        write(&dir.path().join("d"), "a.yaml", &vm("d1"));
        let name = |n: &str| dir.path().join(n).to_str().expect("utf-8").to_owned();
        let files = [name("b.yaml"), name("empty.yaml"), name("d")];
        let units = read_all(&files, false).expect("read");
        let b = name("b.yaml");
        let d = name("d/a.yaml");
        assert_eq!(
            places(&units),
            [
                (format!("{b}: document 1").as_str(), "b1"),
                (format!("{b}: document 2").as_str(), "b2"),
                (format!("{d}: document 1").as_str(), "d1"),
            ]
        );
        assert!(units.iter().all(|u| u.among_others));
        // One input reads as it always did.
        let one = read_all(&files[..1], false).expect("read");
        assert_eq!(one[0].place, "document 1");
        // None at all is said naming every input; standard input can be read once only.
        let err = read_all(&[name("empty.yaml"), name("empty.yaml")], false).expect_err("empty");
        assert!(matches!(err, InputError::NoObjects { .. }), "{err}");
        assert!(err.to_string().contains(" -f "), "{err}");
        let err = read_all(&["-".into(), b, "-".into()], false).expect_err("stdin twice");
        assert!(matches!(err, InputError::StdinTwice), "{err}");
    }

    #[test]
    fn the_dependency_order_puts_what_is_referred_to_first_and_keeps_each_class_in_order() {
        let unit = |kind: &str, name: &str| Unit {
            place: name.to_owned(),
            among_others: true,
            value: serde_json::json!({"kind": kind, "metadata": {"name": name}}),
        };
        let mut units = vec![
            unit("VirtualMachineClone", "clone"),
            unit("VirtualMachineRestore", "restore"),
            unit("VirtualMachineSnapshot", "snap"),
            unit("VirtualMachine", "vm1"),
            unit("Frobnicator", "unknown"),
            unit("VirtualMachineInstance", "vmi"),
            unit("VirtualMachinePreference", "pref"),
            unit("VirtualMachine", "vm2"),
            unit("VirtualMachineClusterInstancetype", "cit"),
            unit("KubeVirt", "kubevirt"),
            unit("VirtualMachineInstancetype", "it"),
            unit("VirtualMachineClusterPreference", "cpref"),
        ];
        units.push(Unit {
            value: serde_json::json!({"metadata": {"name": "kindless"}}),
            ..unit("", "kindless")
        });
        dependency_order(&mut units);
        let order: Vec<&str> = units.iter().map(|u| u.place.as_str()).collect();
        assert_eq!(
            order,
            [
                "kubevirt", "pref", "cit", "it", "cpref", "vm1", "vmi", "vm2", "snap", "restore",
                "clone", "unknown", "kindless",
            ]
        );
    }
}
