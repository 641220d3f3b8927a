//! `cell.tpm`: the TPM statements are quoted by, and its TCTI's form (checked without the
//! host).

use std::path::Path;

use serde::Deserialize;

/// Where `attest tpm-init` persists the attestation key unless `cell.tpm.ak_handle` says.
pub const DEFAULT_AK_HANDLE: u32 = 0x8101_0002;

/// `cell.tpm`: how to reach the TPM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmTarget {
    /// A tpm2-tools TCTI: `device:/dev/tpmrm0`, or `swtpm:host=127.0.0.1,port=2321` for a
    /// software TPM on loopback.
    pub tcti: String,
    pub ak_handle: u32,
}

/// `cell.tpm`: the TPM statements are quoted by.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmConfig {
    /// The tpm2-tools TCTI: `device:/dev/tpmrm0` (the kernel's resource manager), or
    /// `swtpm:host=127.0.0.1,port=N` for a software TPM on loopback.
    pub tcti: String,
    /// The persistent handle of the attestation key `sealnode attest tpm-init` made.
    #[serde(default = "default_ak_handle")]
    pub ak_handle: u32,
}

fn default_ak_handle() -> u32 {
    DEFAULT_AK_HANDLE
}

impl TpmConfig {
    /// A software TPM on loopback: its command and control ports (the swtpm and mssim TCTIs
    /// reach the control channel at port + 1).
    pub fn loopback_ports(&self) -> Option<[u16; 2]> {
        let conf = self.tcti.strip_prefix("swtpm:").or_else(|| self.tcti.strip_prefix("mssim:"))?;
        let port = conf.split(',').rev().find_map(|kv| kv.strip_prefix("port="))?.parse::<u16>().ok()?;
        Some([port, port.wrapping_add(1)])
    }

    pub fn target(&self) -> TpmTarget {
        TpmTarget { tcti: self.tcti.clone(), ak_handle: self.ak_handle }
    }

    /// The TCTI's form, without touching the host: a device under /dev, or a software TPM on
    /// loopback (a TPM elsewhere would bind statements to another machine).
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if !(0x8100_0000..=0x817f_ffff).contains(&self.ak_handle) {
            return Err((
                "cell.tpm.ak_handle",
                format!("{:#010x} is not an owner persistent handle (0x81000000-0x817fffff)", self.ak_handle),
            ));
        }
        if let Some(dev) = self.tcti.strip_prefix("device:") {
            let p = Path::new(dev);
            if !p.is_absolute() || !p.starts_with("/dev") || dev.contains("..") {
                return Err(("cell.tpm.tcti", format!("{dev:?}: a TPM device is a path under /dev, e.g. /dev/tpmrm0")));
            }
            return Ok(());
        }
        let Some((kind, conf)) = self.tcti.split_once(':').filter(|(k, _)| matches!(*k, "swtpm" | "mssim")) else {
            return Err((
                "cell.tpm.tcti",
                format!("{:?}: expected device:/dev/tpmrm0, or swtpm:host=127.0.0.1,port=N", self.tcti),
            ));
        };
        let (mut host, mut port) = (None, None);
        for kv in conf.split(',') {
            match kv.split_once('=') {
                Some(("host", h)) => host = Some(h),
                Some(("port", n)) if n.parse::<u16>().is_ok_and(|p| p < u16::MAX) => port = Some(n),
                _ => return Err(("cell.tpm.tcti", format!("{kind}: {kv:?} is not host=ADDRESS or port=N"))),
            }
        }
        // The port is explicit: the config's egress check needs to know it (libtss2's default
        // would otherwise be an unseen 2321).
        if port.is_none() {
            return Err((
                "cell.tpm.tcti",
                format!("{kind}: give port=N (the TPM's command port; N + 1 is its control port)"),
            ));
        }
        match host {
            Some("127.0.0.1" | "localhost" | "::1") => Ok(()),
            Some(h) => Err((
                "cell.tpm.tcti",
                format!("{kind} host {h:?}: a software TPM must be on loopback (a TPM elsewhere binds statements to another machine)"),
            )),
            None => Err(("cell.tpm.tcti", format!("{kind}: give host=127.0.0.1"))),
        }
    }
}
