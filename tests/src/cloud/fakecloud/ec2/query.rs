//! Reading a `DescribeInstances` request: the action and version, the
//! instance IDs and filters, each checked as EC2 checks them.

use super::Ec2Error;
use std::collections::BTreeMap;

use crate::cloud::fakecloud::Instance;

pub(crate) fn check_action(params: &BTreeMap<String, String>) -> Result<(), Ec2Error> {
    match params.get("Action").map(String::as_str) {
        Some("DescribeInstances") => {}
        Some(other) => {
            return Err(Ec2Error::bad_request(
                "InvalidAction",
                format!("The action {other} is not valid for this web service."),
            ))
        }
        None => {
            return Err(Ec2Error::bad_request(
                "MissingAction",
                "The request must contain the parameter Action",
            ))
        }
    }
    if params.get("Version").is_none_or(String::is_empty) {
        return Err(Ec2Error::bad_request(
            "MissingParameter",
            "The request must contain the parameter Version",
        ));
    }
    Ok(())
}

/// What a DescribeInstances request asks for.
#[derive(Debug, Default)]
pub(crate) struct Query {
    /// `InstanceId.N`: each must exist, or the whole call fails.
    instance_ids: Vec<String>,
    /// `Filter.N`: name and accepted values; no match is just no result.
    filters: Vec<(String, Vec<String>)>,
}

impl Query {
    pub(crate) fn from_params(params: &BTreeMap<String, String>) -> Result<Self, Ec2Error> {
        let mut query = Query::default();
        let mut filters: BTreeMap<u32, (Option<String>, Vec<String>)> = BTreeMap::new();
        for (key, value) in params {
            let parts: Vec<&str> = key.split('.').collect();
            match parts.as_slice() {
                ["InstanceId", _] => query.instance_ids.push(value.clone()),
                ["Filter", n, "Name"] => {
                    filters.entry(index(n)?).or_default().0 = Some(value.clone())
                }
                ["Filter", n, "Value", _] => {
                    filters.entry(index(n)?).or_default().1.push(value.clone())
                }
                _ => {}
            }
        }
        for (name, values) in filters.into_values() {
            let name = name.ok_or_else(|| {
                Ec2Error::bad_request("InvalidParameterValue", "The filter 'null' is invalid")
            })?;
            if !matches!(name.as_str(), "instance-id" | "instance-state-name") {
                return Err(Ec2Error::bad_request(
                    "InvalidParameterValue",
                    format!("The filter '{name}' is invalid"),
                ));
            }
            query.filters.push((name, values));
        }
        for id in &query.instance_ids {
            check_instance_id(id)?;
        }
        Ok(query)
    }

    pub(crate) fn select<'a>(
        &self,
        instances: &[&'a Instance],
    ) -> Result<Vec<&'a Instance>, Ec2Error> {
        let missing: Vec<&str> = self
            .instance_ids
            .iter()
            .filter(|id| !instances.iter().any(|i| &i.instance_id == *id))
            .map(String::as_str)
            .collect();
        match missing.as_slice() {
            [] => {}
            [one] => {
                return Err(Ec2Error::bad_request(
                    "InvalidInstanceID.NotFound",
                    format!("The instance ID '{one}' does not exist"),
                ))
            }
            many => {
                return Err(Ec2Error::bad_request(
                    "InvalidInstanceID.NotFound",
                    format!("The instance IDs '{}' do not exist", many.join(", ")),
                ))
            }
        }
        Ok(instances
            .iter()
            .copied()
            .filter(|i| self.instance_ids.is_empty() || self.instance_ids.contains(&i.instance_id))
            .filter(|i| {
                self.filters
                    .iter()
                    .all(|(name, values)| filter_matches(i, name, values))
            })
            .collect())
    }
}

pub(crate) fn index(n: &str) -> Result<u32, Ec2Error> {
    n.parse()
        .map_err(|_| Ec2Error::bad_request("InvalidParameterValue", format!("Invalid index: {n}")))
}

pub(crate) fn filter_matches(instance: &Instance, name: &str, values: &[String]) -> bool {
    let actual = match name {
        "instance-id" => instance.instance_id.as_str(),
        _ => instance.state.name(),
    };
    values.iter().any(|v| v == actual)
}

/// EC2 instance IDs: `i-` and 8 or 17 lower-case hex digits.
pub(crate) fn check_instance_id(id: &str) -> Result<(), Ec2Error> {
    let well_formed = id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if well_formed {
        Ok(())
    } else {
        Err(Ec2Error::bad_request(
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{id}\" (expecting \"i-...\")"),
        ))
    }
}
