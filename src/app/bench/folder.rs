//! The bench's folder: replaced whole at every bench, so only a folder the bench made (or an
//! empty or new one) is ever removed; a user's folder named by mistake is refused untouched.

use std::path::Path;

use crate::error::{Error, Invalid, io};

/// The file that marks a folder as the bench's own.
const MARK: &str = ".gacc-bench";

/// Makes `folder` new and empty for the bench, removing what an earlier bench left there.
pub(super) fn replace(folder: &Path) -> Result<(), Error> {
    let holds_something = match std::fs::read_dir(folder) {
        Ok(mut entries) => entries.next().is_some(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => return Err(io(folder)(error)),
    };
    if holds_something {
        if !folder.join(MARK).is_file() {
            return Err(Invalid::one(
                format!("--folder {}", folder.display()),
                format!(
                    "this folder is not empty and was not made by `gacc bench` (no {MARK} in it); \
                     the bench replaces its folder whole, so name a new or empty one"
                ),
            )
            .into());
        }
        std::fs::remove_dir_all(folder).map_err(io(folder))?;
    }
    std::fs::create_dir_all(folder).map_err(io(folder))?;
    let mark = folder.join(MARK);
    std::fs::write(&mark, "made by `gacc bench`, which replaces this folder whole\n").map_err(io(&mark))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_an_empty_or_the_benchs_own_folder_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        replace(&new).unwrap();
        std::fs::write(new.join("left by the last bench"), "x").unwrap();
        replace(&new).unwrap();
        let left: Vec<_> = std::fs::read_dir(&new)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [MARK], "what the last bench left is gone, the mark is back");

        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        replace(&empty).unwrap();

        let users = dir.path().join("experiments");
        std::fs::create_dir(&users).unwrap();
        std::fs::write(users.join("paper.toml"), "kept").unwrap();
        let refused = replace(&users).unwrap_err().to_string();
        assert!(
            refused.contains("--folder") && refused.contains("not made by `gacc bench`"),
            "{refused}"
        );
        assert_eq!(std::fs::read_to_string(users.join("paper.toml")).unwrap(), "kept");
        assert!(!users.join(MARK).exists());
    }
}
