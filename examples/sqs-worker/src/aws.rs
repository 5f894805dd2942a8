//! The standard AWS configuration the SQS (and DynamoDB) clients are built from.

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::SharedHttpClient;

/// The HTTP client the AWS SDK runs on: hyper with rustls on ring. It also
/// speaks plain HTTP, which the instance metadata service, the ECS credential
/// endpoint and local endpoints such as moto need.
pub fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::{Builder, tls};
    Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https()
}

/// Credentials from the default chain (environment, profile with SSO or
/// `credential_process`, web identity, ECS task role, instance role), the
/// region from `AWS_REGION` or the profile, `AWS_ENDPOINT_URL_SQS` /
/// `AWS_ENDPOINT_URL_DYNAMODB` for a local endpoint such as moto.
pub async fn aws_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}
