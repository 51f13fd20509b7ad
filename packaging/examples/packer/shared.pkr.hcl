# What both AMI templates share (this folder's and attestable/'s, where
# it is a link to this file): the Packer and plugin they need, and the
# inputs every node image has.

packer {
  required_version = ">= 1.9.4"
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.4"
    }
  }
}

variable "region" {
  type        = string
  description = "The AWS region the AMIs are made in."
}

variable "kubernetes_version" {
  type        = string
  description = "The kubelet's version, X.Y.Z (one your control plane supports): downloaded from dl.k8s.io on the build instance and checked against its published SHA-256."
  validation {
    condition     = can(regex("^1\\.[0-9]+\\.[0-9]+$", var.kubernetes_version))
    error_message = "The kubernetes_version is X.Y.Z, e.g. 1.34.2 (no leading v)."
  }
}
