//! Paths as recorded: a lookup's path is kept as the program gave it to
//! the kernel, and programs build paths loosely (fontconfig asks for
//! `~/.cache/fontconfig//NAME`). The kernel resolves `//`, `/./` and a
//! trailing `/` without a lookup of their own, so they are taken out once,
//! when recorded, and every trace, plan and export holds the clean form.
//! `..` stays: whether it undoes the component before it depends on
//! symbolic links, which only the file system knows.

/// `path` with repeated slashes, `.` components and a trailing slash
/// taken out (`/` stays `/`; a relative path stays relative).
pub fn lexically_clean(path: &str) -> String {
    let absolute = path.starts_with('/');
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// Whether `path` is absolute and already clean, with no `..` (what a
/// portable plan may name).
pub fn is_clean_absolute(path: &str) -> bool {
    path.starts_with('/')
        && (path == "/"
            || path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_s_no_op_components_are_taken_out() {
        assert_eq!(
            lexically_clean("/root/.cache/fontconfig//4c59-le64.cache-8"),
            "/root/.cache/fontconfig/4c59-le64.cache-8"
        );
        assert_eq!(lexically_clean("/usr/./lib//x/"), "/usr/lib/x");
        assert_eq!(lexically_clean("///"), "/");
        assert_eq!(lexically_clean("/"), "/");
        assert_eq!(lexically_clean("a//b/./"), "a/b");
        assert_eq!(lexically_clean("./"), ".");
    }

    #[test]
    fn dot_dot_is_left_to_the_file_system() {
        assert_eq!(lexically_clean("/usr/lib/../share"), "/usr/lib/../share");
        assert!(!is_clean_absolute("/usr/lib/../share"));
        assert!(is_clean_absolute("/usr/share"));
        assert!(is_clean_absolute("/"));
        assert!(!is_clean_absolute("usr"));
        assert!(!is_clean_absolute("/usr//share"));
    }
}
