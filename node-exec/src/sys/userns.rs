//! The user namespace that owns a namespace (ioctl NS_GET_USERNS): the kernel reads a socket's
//! owner (`meta skuid`, `meta skgid`) through the user namespace owning its network namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// _IO(0xb7, 0x1), linux/nsfs.h.
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// The user namespace owning the namespace `ns` is open on, as an open nsfs file.
pub fn owner(ns: &File) -> io::Result<File> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd (or -1) for a valid, open
    // namespace fd; nothing else is touched.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd, and nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}
