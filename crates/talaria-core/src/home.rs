//! The Talaria home directory and the paths inside it.

use std::io;
use std::path::{Path, PathBuf};

/// The profile that is the home itself.
pub const DEFAULT_PROFILE: &str = "default";

/// `TALARIA_HOME`: where configuration, the database, memories and skills live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// Uses `root` as the home without touching the file system.
    pub fn at(root: impl Into<PathBuf>) -> Home {
        Home { root: root.into() }
    }

    /// `$TALARIA_HOME`, else `~/.talaria`.
    pub fn from_env() -> io::Result<Home> {
        if let Some(dir) = std::env::var_os("TALARIA_HOME").filter(|v| !v.is_empty()) {
            return Ok(Home::at(dir));
        }
        let home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "neither TALARIA_HOME nor HOME is set; set TALARIA_HOME to a directory",
                )
            })?;
        Ok(Home::at(PathBuf::from(home).join(".talaria")))
    }

    /// Creates the home (mode 0700: it holds secrets) and its sub-folders.
    pub fn ensure(&self) -> io::Result<()> {
        create_private_dir(&self.root)?;
        for dir in [
            self.memories_dir(),
            self.skills_dir(),
            self.logs_dir(),
            self.tool_output_dir(),
        ] {
            create_private_dir(&dir)?;
        }
        Ok(())
    }

    /// The home directory itself (`TALARIA_HOME`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `config.yaml`, the configuration.
    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.yaml")
    }

    /// `.env`, where secrets the configuration names are kept.
    pub fn dotenv_file(&self) -> PathBuf {
        self.root.join(".env")
    }

    /// `state.db`, the SQLite store.
    pub fn state_db(&self) -> PathBuf {
        self.root.join("state.db")
    }

    /// `SOUL.md`, the agent's identity, read into every system prompt.
    pub fn soul_file(&self) -> PathBuf {
        self.root.join("SOUL.md")
    }

    /// `memories/`, the agent's `MEMORY.md` and `USER.md`.
    pub fn memories_dir(&self) -> PathBuf {
        self.root.join("memories")
    }

    /// `skills/`, the user's skills (they win over bundled ones).
    pub fn skills_dir(&self) -> PathBuf {
        self.root.join("skills")
    }

    /// `logs/`, the log files.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// Where oversized tool results are spilled.
    pub fn tool_output_dir(&self) -> PathBuf {
        self.root.join("tool-output")
    }

    /// Line-editor history of `talaria chat`.
    pub fn chat_history_file(&self) -> PathBuf {
        self.root.join("chat_history")
    }

    /// Gateway event hooks, one folder each (`hooks/<name>/HOOK.yaml`).
    pub fn hooks_dir(&self) -> PathBuf {
        self.root.join("hooks")
    }

    /// Where the profiles live: each is a home of its own,
    /// `profiles/<name>/`, with its own configuration, database, memory,
    /// skills and gateway.
    pub fn profiles_dir(&self) -> PathBuf {
        self.root.join("profiles")
    }

    /// The home of the profile `name` (`default` is this home itself).
    ///
    /// # Errors
    /// A name that could not be one folder (`..`, `/`, a leading dot).
    pub fn profile(&self, name: &str) -> Result<Home, crate::ids::IdError> {
        if name == DEFAULT_PROFILE {
            return Ok(self.clone());
        }
        crate::ids::validate_path_component(name)?;
        Ok(Home::at(self.profiles_dir().join(name)))
    }

    /// The running gateway's PID file, held under an exclusive lock.
    pub fn gateway_pid_file(&self) -> PathBuf {
        self.root.join("gateway.pid")
    }

    /// What the running gateway reports about itself (`gateway status`).
    pub fn gateway_state_file(&self) -> PathBuf {
        self.root.join("gateway_state.json")
    }

    /// The running gateway's control socket (`talaria send` hands messages
    /// to the gateway through it). Mode 0600.
    pub fn gateway_socket(&self) -> PathBuf {
        self.root.join("gateway.sock")
    }

    /// `media/`, the cache of files users send (photos, voice notes,
    /// documents), each named by the sha256 of its content.
    pub fn media_dir(&self) -> PathBuf {
        self.root.join("media")
    }

    /// Output nobody waits for in a chat: cron runs, `local` deliveries.
    pub fn cron_output_dir(&self) -> PathBuf {
        self.root.join("cron").join("output")
    }
}

fn create_private_dir(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let existed = path.is_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
        if !existed {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(unix)]
    fn ensure_creates_a_private_home() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("h"));
        home.ensure().unwrap();
        let mode = std::fs::metadata(home.root()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(home.memories_dir().is_dir());
        home.ensure().unwrap();
    }

    #[test]
    fn the_media_cache_is_a_folder_of_the_home() {
        let home = Home::at("/srv/talaria");
        assert_eq!(home.media_dir(), Path::new("/srv/talaria/media"));
    }
}
