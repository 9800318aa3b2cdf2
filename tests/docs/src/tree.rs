//! The repository's own files: what the checks read, without what is not ours (`vendor/`) or
//! not source (build output, local state, git).

use std::{
    io,
    path::{Path, PathBuf},
};

const NOT_OURS: &[&str] = &["vendor", "target", ".local", ".git", ".aws-sam"];

/// The repository this crate is in (two levels up).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` whose name ends in `.<extension>`, sorted.
pub fn files(dir: &Path, extension: &str) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    walk(dir, extension, &mut found)?;
    found.sort();
    Ok(found)
}

fn walk(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if !name.is_some_and(|n| NOT_OURS.contains(&n.as_str())) {
                walk(&path, extension, found)?;
            }
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
    Ok(())
}

/// `path` relative to the repository, for messages.
pub fn shown(path: &Path) -> String {
    let repository = repository();
    path.strip_prefix(&repository)
        .unwrap_or(path)
        .display()
        .to_string()
}
