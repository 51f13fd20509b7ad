//! A kubelet's version read from its file, without running it.
//!
//! Kubernetes' build stamps the version into the binary with the linker
//! (`-X …/component-base/version.gitVersion=v1.34.1`), and Go (1.18 and
//! later) records those linker flags in the binary's build information,
//! the `.go.buildinfo` ELF section that `go version -m` prints. `kubelet
//! --version` prints that same value, but running a 100 MB Go binary costs
//! about 0.1 s on a real machine and over ten seconds under software
//! emulation, mostly its package initialisers; reading the section costs a
//! few kilobytes of I/O. A kubelet built otherwise (older Go, other flags)
//! has no such record, and the caller runs `kubelet --version` instead.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Go's marker at the start of the build information.
const MAGIC: &[u8] = b"\xff Go buildinf:";
/// The linker flag that holds the version (the package path before it
/// differs: vendored or not).
const GIT_VERSION: &str = "component-base/version.gitVersion=";
/// More than any real section holds (tens of kilobytes): a bound, so that
/// a corrupt header cannot make the agent read a whole file.
const MAX_SECTION: u64 = 4 << 20;
const MAX_HEADERS: u64 = 1 << 20;

/// The version text stamped into the kubelet at `path` (`v1.34.1`), if its
/// build recorded one. Any problem (not ELF, no section, an older Go) is
/// `None`. The text is returned as stamped: reading it as a version is
/// [`super::version`]'s job, and this module needs nothing of it.
pub fn stamped_version(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let section = section(&mut file, ".go.buildinfo")?;
    let modinfo = modinfo(&section)?;
    let stamped = modinfo.split(GIT_VERSION).nth(1)?;
    let word: String = stamped
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '\'' && *c != '"')
        .collect();
    Some(word)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn read_at(file: &mut File, offset: u64, len: u64, max: u64) -> Option<Vec<u8>> {
    if len > max {
        return None;
    }
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut bytes = vec![0; usize::try_from(len).ok()?];
    file.read_exact(&mut bytes).ok()?;
    Some(bytes)
}

/// The contents of the section `name` of a little-endian 64-bit ELF file.
fn section(file: &mut File, name: &str) -> Option<Vec<u8>> {
    let header = read_at(file, 0, 64, 64)?;
    // \x7fELF, 64-bit (2), little-endian (1).
    if header.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let table = u64_at(&header, 0x28)?;
    let entry = u64::from(u16_at(&header, 0x3a)?);
    let count = u64::from(u16_at(&header, 0x3c)?);
    let names_index = usize::from(u16_at(&header, 0x3e)?);
    if entry < 64 {
        return None;
    }
    let headers = read_at(file, table, entry.checked_mul(count)?, MAX_HEADERS)?;
    let entry = usize::try_from(entry).ok()?;
    let at = |index: usize| -> Option<(u32, u64, u64)> {
        let start = index.checked_mul(entry)?;
        let header = headers.get(start..start.checked_add(entry)?)?;
        Some((u32_at(header, 0)?, u64_at(header, 24)?, u64_at(header, 32)?))
    };
    let (_, names_offset, names_size) = at(names_index)?;
    let names = read_at(file, names_offset, names_size, MAX_HEADERS)?;
    let wanted = name.as_bytes();
    let found = (0..usize::try_from(count).ok()?).find_map(|index| {
        let (name_at, offset, size) = at(index)?;
        let rest = names.get(usize::try_from(name_at).ok()?..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        (&rest[..end] == wanted).then_some((offset, size))
    })?;
    read_at(file, found.0, found.1, MAX_SECTION)
}

/// Go's module information from a `.go.buildinfo` section whose strings
/// are inline (Go 1.18 and later: flag bit 2); the header is 32 bytes.
fn modinfo(section: &[u8]) -> Option<String> {
    if !section.starts_with(MAGIC) || section.get(15)? & 2 == 0 {
        return None;
    }
    let rest = section.get(32..)?;
    let (_go_version, rest) = inline_string(rest)?;
    let (modinfo, _) = inline_string(rest)?;
    Some(String::from_utf8_lossy(modinfo).into_owned())
}

/// A string as Go's linker writes it here: its length as an unsigned
/// varint, then its bytes.
fn inline_string(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut len: u64 = 0;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        len |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let start = i + 1;
            let end = start.checked_add(usize::try_from(len).ok()?)?;
            return Some((bytes.get(start..end)?, bytes.get(end..)?));
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn varint(mut n: usize, out: &mut Vec<u8>) {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }

    /// The `.go.buildinfo` section a Go 1.18+ build of kubelet carries,
    /// with `ldflags` as its recorded linker flags.
    fn buildinfo(ldflags: &str) -> Vec<u8> {
        let mut section = MAGIC.to_vec();
        section.extend([8, 2]);
        section.resize(32, 0);
        for text in [
            "go1.22.5".to_string(),
            format!(
                "0w\u{af}\u{c}path\tk8s.io/kubernetes/cmd/kubelet\nbuild\t-ldflags=\"{ldflags}\"\nbuild\tCGO_ENABLED=0\n"
            ),
        ] {
            varint(text.len(), &mut section);
            section.extend(text.as_bytes());
        }
        section
    }

    /// A minimal ELF file: header, the section's bytes, the section names,
    /// and three section headers (null, the section, the names).
    pub(crate) fn elf_with(name: &str, contents: &[u8]) -> Vec<u8> {
        let names = format!("\0{name}\0.shstrtab\0");
        let mut file = vec![0u8; 64];
        file[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let contents_at = file.len() as u64;
        file.extend(contents);
        let names_at = file.len() as u64;
        file.extend(names.as_bytes());
        let table = file.len() as u64;
        file[0x28..0x30].copy_from_slice(&table.to_le_bytes());
        file[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        file[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        file[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        let sections = [
            (0u32, 0u64, 0u64),
            (1, contents_at, contents.len() as u64),
            (name.len() as u32 + 2, names_at, names.len() as u64),
        ];
        for (name_at, offset, size) in sections {
            let mut header = vec![0u8; 64];
            header[..4].copy_from_slice(&name_at.to_le_bytes());
            header[24..32].copy_from_slice(&offset.to_le_bytes());
            header[32..40].copy_from_slice(&size.to_le_bytes());
            file.extend(header);
        }
        file
    }

    /// A kubelet file stamped with `version` by Kubernetes' build.
    pub(crate) fn stamped_kubelet(version: &str) -> Vec<u8> {
        let ldflags = format!(
            "-s -w -X 'k8s.io/component-base/version.gitCommit=abc' \
             -X 'k8s.io/component-base/version.gitVersion={version}' \
             -X 'k8s.io/component-base/version.gitTreeState=clean'"
        );
        elf_with(".go.buildinfo", &buildinfo(&ldflags))
    }

    #[test]
    fn reads_the_version_kubernetes_build_stamped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet");
        for (stamp, want) in [
            ("v1.34.1", "v1.34.1"),
            ("v1.29.3-eks-ae9a62a", "v1.29.3-eks-ae9a62a"),
        ] {
            std::fs::write(&path, stamped_kubelet(stamp)).unwrap();
            assert_eq!(stamped_version(&path).as_deref(), Some(want), "{stamp}");
        }
        // The vendored package path of older trees.
        let vendored =
            "-X 'k8s.io/kubernetes/vendor/k8s.io/component-base/version.gitVersion=v1.20.2'";
        std::fs::write(&path, elf_with(".go.buildinfo", &buildinfo(vendored))).unwrap();
        assert_eq!(stamped_version(&path).as_deref(), Some("v1.20.2"));
    }

    #[test]
    fn anything_else_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet");
        let mut old_go = buildinfo("-X 'k8s.io/component-base/version.gitVersion=v1.20.2'");
        old_go[15] = 0; // strings by pointer, before Go 1.18
        let mut truncated = stamped_kubelet("v1.34.1");
        truncated.truncate(truncated.len() - 10);
        let cases = [
            b"#!/bin/sh\necho Kubernetes v1.34.1\n".to_vec(),
            Vec::new(),
            elf_with(".data", b"v1.34.1"),
            elf_with(".go.buildinfo", &buildinfo("-s -w")),
            elf_with(".go.buildinfo", &old_go),
            elf_with(".go.buildinfo", &MAGIC[..10]),
            truncated,
        ];
        for (i, contents) in cases.iter().enumerate() {
            std::fs::write(&path, contents).unwrap();
            assert_eq!(stamped_version(&path), None, "case {i}");
        }
        assert_eq!(stamped_version(&dir.path().join("missing")), None);
        // This test binary is ELF without Go's section.
        let me = std::env::current_exe().unwrap();
        assert_eq!(stamped_version(&me), None);
    }
}
