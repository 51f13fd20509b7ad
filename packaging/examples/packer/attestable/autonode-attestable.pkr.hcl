# An attestable autonode node AMI (NitroTPM), for x86_64 and arm64 at once:
# Amazon Linux 2023 booted from a Unified Kernel Image, with kubelet,
# containerd and the agent's package, registered with NitroTPM and UEFI
# boot, and its reference PCRs (4, 7, 12) written as the bake's output,
# measurements/<AMI name>.measurements.yaml, in the form the server's
# --attestation-policy reads. Walkthrough: ../../AMI.md, "Attestable AMI".
#
#   cd packaging/examples/packer/attestable
#   packer init .
#   packer build -var region=us-west-2 -var kubernetes_version=1.34.2 \
#     -var repository=https://packages.example.com/autonode/yum \
#     -var repository_key=autonode-release-key.asc .
#   packer build -only='*.arm64' ...   # one architecture
#
# Its own template, not a variable of ../autonode.pkr.hcl: that one's
# amazon-ebs builder snapshots the build instance, which can neither set
# NitroTPM on the AMI (amazon plugin 1.3.4 has no tpm_support for it) nor
# leave the instance's UEFI boot entries behind, and a stale boot entry
# changes PCR4. Here amazon-ebssurrogate builds the image on a second,
# empty volume (packaging/bake/attestable) and registers that volume as
# the AMI, with a fresh UEFI variable store.
#
# The Packer and plugin it needs and the region and kubernetes_version
# inputs are in shared.pkr.hcl, a link to the other template's.
#
# Tested by `packer validate` in tests/run, as the other template is; not
# built against AWS there.

variable "agent_version" {
  type        = string
  description = "The agent's package version: packaging/build names its packages autonode-agent-<version>-1.<arch>.rpm (`packaging/version --package`: 0.3.0~dev between releases)."
  default     = "0.3.0~dev"
}

variable "repository" {
  type        = string
  description = "The URL of the release's signed YUM repository (the yum/ folder packaging/sign lays out, served over HTTPS); the agent is installed from it, checked with repository_key. Empty: the .rpm is uploaded from `packages` instead."
  default     = ""
}

variable "repository_key" {
  type        = string
  description = "With `repository`: the release's public key file (autonode-release-key.asc), whose fingerprint you checked against the one packaging/README.md publishes."
  default     = ""
}

variable "packages" {
  type        = string
  description = "Without `repository`: the directory with the agent's .rpm packages; empty means this repository's target/packages/."
  default     = ""
}

variable "measurements" {
  type        = string
  description = "Where each AMI's measurements.yaml is written (as <AMI name>.measurements.yaml); empty means measurements/ beside this template."
  default     = ""
}

variable "ami_name_prefix" {
  type    = string
  default = "autonode-node-al2023"
}

locals {
  packages     = var.packages != "" ? var.packages : "${path.root}/../../../../target/packages"
  measurements = var.measurements != "" ? var.measurements : "${path.root}/measurements"
  bake         = "${path.root}/../../../bake"
  # One timestamp for both architectures' names; an AMI name has no `~`.
  stamp = formatdate("YYYYMMDDhhmm", timestamp())
  name  = "${var.ami_name_prefix}-${replace(var.agent_version, "~", "-")}"
}

# What both architectures share; the build below sets what differs.
source "amazon-ebssurrogate" "attestable" {
  region       = var.region
  ssh_username = "ec2-user"
  # The AMI: UEFI (which NitroTPM needs), NitroTPM 2.0, IMDSv2 only (the
  # agent requires it at boot, as in the other recipe).
  boot_mode               = "uefi"
  tpm_support             = "v2.0"
  imds_support            = "v2.0"
  ami_virtualization_type = "hvm"
  ena_support             = true
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  # The empty volume the image is made on, and that becomes the AMI's root.
  launch_block_device_mappings {
    device_name           = "/dev/xvdf"
    volume_size           = 8
    volume_type           = "gp3"
    delete_on_termination = true
  }
  ami_root_device {
    source_device_name    = "/dev/xvdf"
    device_name           = "/dev/xvda"
    volume_size           = 8
    volume_type           = "gp3"
    delete_on_termination = true
  }
  tags = {
    Name                  = "${local.name}-${local.stamp}"
    "autonode:agent"      = var.agent_version
    "autonode:kubelet"    = var.kubernetes_version
    "autonode:attestable" = "nitrotpm"
    "autonode:source"     = "{{ .SourceAMIName }}"
  }
}

build {
  # source.name is the architecture as EC2 and the measurements' names
  # spell it; the kubelet's download and the .rpm's name use uname -m's.
  source "amazon-ebssurrogate.attestable" {
    name             = "x86_64"
    ami_name         = "${local.name}-x86_64-${local.stamp}"
    ami_architecture = "x86_64"
    instance_type    = "m6i.large"
    source_ami_filter {
      filters = {
        name                = "al2023-ami-2023.*-kernel-6.1-x86_64"
        architecture        = "x86_64"
        root-device-type    = "ebs"
        virtualization-type = "hvm"
      }
      owners      = ["amazon"]
      most_recent = true
    }
  }

  source "amazon-ebssurrogate.attestable" {
    name             = "arm64"
    ami_name         = "${local.name}-arm64-${local.stamp}"
    ami_architecture = "arm64"
    instance_type    = "m7g.large"
    source_ami_filter {
      filters = {
        name                = "al2023-ami-2023.*-kernel-6.1-arm64"
        architecture        = "arm64"
        root-device-type    = "ebs"
        virtualization-type = "hvm"
      }
      owners      = ["amazon"]
      most_recent = true
    }
  }

  provisioner "shell" {
    inline = ["mkdir -p /tmp/autonode"]
  }

  # The release key (to install from the repository) or the package itself.
  provisioner "file" {
    sources     = var.repository != "" ? [var.repository_key] : ["${local.packages}/autonode-agent-${var.agent_version}-1.${source.name == "arm64" ? "aarch64" : "x86_64"}.rpm"]
    destination = "/tmp/autonode/"
  }

  # The scripts (attestable, provision, measurements) and kubelet's unit.
  provisioner "file" {
    source      = local.bake
    destination = "/tmp"
  }

  provisioner "shell" {
    inline = [
      "set -eu",
      "url=https://dl.k8s.io/release/v${var.kubernetes_version}/bin/linux/${source.name == "arm64" ? "arm64" : "amd64"}/kubelet",
      "curl -fsSLo /tmp/kubelet \"$url\"",
      "echo \"$(curl -fsSL \"$url.sha256\")  /tmp/kubelet\" | sha256sum --check --strict",
      "chmod 0755 /tmp/bake/attestable /tmp/bake/provision /tmp/bake/measurements",
      "if [ -n '${var.repository}' ]; then",
      "  agent=\"--repository ${var.repository} --repository-key /tmp/autonode/$(basename '${var.repository_key}') --agent-version ${var.agent_version}\"",
      "else",
      "  agent=\"--package $(ls /tmp/autonode/autonode-agent-*.rpm)\"",
      "fi",
      "sudo /tmp/bake/attestable --device /dev/xvdf --name '${local.name}-${source.name}-${local.stamp}' --kubelet /tmp/kubelet --out /tmp/autonode-out $agent",
    ]
  }

  # The bake's output: the measurements the server's policy admits this AMI by.
  provisioner "file" {
    direction   = "download"
    source      = "/tmp/autonode-out/measurements.yaml"
    destination = "${local.measurements}/${local.name}-${source.name}-${local.stamp}.measurements.yaml"
  }
}
